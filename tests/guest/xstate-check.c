/*
 * Guest-side check that a process's vector registers are its own: N processes each
 * hold a distinct pattern in the widest vector registers user mode may use (as XGETBV
 * reports them: ZMM/YMM16-31 with AVX-512, YMM with AVX, else XMM) and check it
 * stays there while the guest kernel switches between them. Prints the XCR0 user mode
 * sees and exits 1 if any process found its registers changed by another.
 *
 * Built by tests/tests/vm_xstate.rs with `gcc -O1 -static` and WITHOUT -mavx*, so the
 * compiler itself never touches the registers under test; only the asm below does.
 */
#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum width { SSE, AVX, AVX512 };

static uint64_t xgetbv0(void)
{
	uint32_t a, d;
	__asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(0));
	return ((uint64_t)d << 32) | a;
}

static void load(enum width w, const uint32_t *p)
{
	if (w == AVX512)
		__asm__ volatile("vmovdqu32 (%0), %%ymm31" ::"r"(p) : "memory");
	else if (w == AVX)
		__asm__ volatile("vmovdqu (%0), %%ymm15" ::"r"(p) : "memory", "xmm15");
	else
		__asm__ volatile("movdqu (%0), %%xmm15" ::"r"(p) : "memory", "xmm15");
}

static void store(enum width w, uint32_t *p)
{
	if (w == AVX512)
		__asm__ volatile("vmovdqu32 %%ymm31, (%0)" ::"r"(p) : "memory");
	else if (w == AVX)
		__asm__ volatile("vmovdqu %%ymm15, (%0)" ::"r"(p) : "memory");
	else
		__asm__ volatile("movdqu %%xmm15, (%0)" ::"r"(p) : "memory");
}

/* Returns the number of times the pattern was found changed. */
static long hold(int id, enum width w, long iters)
{
	uint32_t pat[8], out[8];
	int words = w == SSE ? 4 : 8;
	long bad = 0;
	for (int i = 0; i < 8; i++)
		pat[i] = 0x01010101u * (uint32_t)(id + 1) + (uint32_t)i;
	load(w, pat);
	for (long n = 0; n < iters; n++) {
		store(w, out);
		for (int i = 0; i < words; i++) {
			if (out[i] != pat[i]) {
				bad++;
				load(w, pat);
				break;
			}
		}
	}
	return bad;
}

int main(int argc, char **argv)
{
	int procs = argc > 1 ? atoi(argv[1]) : 3;
	long iters = argc > 2 ? atol(argv[2]) : 20000000;
	unsigned a, b, c, d;
	uint64_t xcr0 = 0;
	enum width w = SSE;

	__cpuid(1, a, b, c, d);
	if (c & (1u << 27)) /* OSXSAVE: XGETBV is available */
		xcr0 = xgetbv0();
	__cpuid_count(7, 0, a, b, c, d);
	if ((xcr0 & 0xe6) == 0xe6 && (b & (1u << 16)) && (b & (1u << 31)))
		w = AVX512; /* opmask, ZMM_Hi256, Hi16_ZMM, YMM, SSE enabled; AVX512F+VL */
	else if ((xcr0 & 0x6) == 0x6)
		w = AVX;
	printf("xcr0=%#llx registers=%s\n", (unsigned long long)xcr0,
	       w == AVX512 ? "avx512" : w == AVX ? "avx" : "sse");
	fflush(stdout);

	for (int i = 0; i < procs; i++)
		if (fork() == 0)
			_exit(hold(i, w, iters) ? 1 : 0);
	int corrupted = 0, died = 0;
	for (int i = 0; i < procs; i++) {
		int st;
		if (wait(&st) < 0)
			break;
		if (WIFEXITED(st) && WEXITSTATUS(st))
			corrupted++;
		else if (!WIFEXITED(st))
			died++;
	}
	printf("corrupted=%d died=%d of %d\n", corrupted, died, procs);
	return corrupted || died ? 1 : 0;
}
