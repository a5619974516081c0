/*
 * boot-timer: runs a VMM and timestamps every line it prints, on its stdout and (with -f) in
 * the file it writes its guest console to, in milliseconds since just before the VMM was
 * started. Stops the VMM (SIGKILL) at the first line containing PATTERN.
 *
 *   boot-timer [-f FILE] -u PATTERN [-t SECS] -- CMD [ARGS...]
 *
 * FILE is created empty and followed with inotify (voidbox's VMM writes its console log with
 * pwrite, so it cannot be a pipe).
 *
 * Output, one line per input line: "<ms> <o|c> <line>" (o: the VMM's stdout, c: FILE),
 * then "<ms> UNTIL" when PATTERN was seen (exit 0), or "TIMEOUT" (exit 1).
 * Used by scripts/tcg-l1.sh's boot comparison (TCG_L1_BENCH), where the guest console is the
 * only clock both VMMs share. Blocking reads only: the L1 has one vCPU, so no polling loop
 * may steal it from the guest being measured.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct timespec t0;

static double elapsed_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6;
}

struct src {
  int fd;
  int wd; /* inotify: fd is the watch, file the followed file */
  int file;
  char tag;
  char buf[8192];
  size_t len;
};

/* Emits the complete lines in s->buf; returns 1 when one contains pattern. */
static int drain(struct src *s, const char *pattern) {
  int hit = 0;
  char *start = s->buf;
  char *nl;
  while ((nl = memchr(start, '\n', s->len - (size_t)(start - s->buf))) != NULL) {
    *nl = '\0';
    if (nl > start && nl[-1] == '\r') nl[-1] = '\0';
    printf("%.1f %c %s\n", elapsed_ms(), s->tag, start);
    if (strstr(start, pattern)) hit = 1;
    start = nl + 1;
  }
  size_t rest = s->len - (size_t)(start - s->buf);
  memmove(s->buf, start, rest);
  s->len = rest;
  if (s->len == sizeof s->buf) { /* an over-long line: emit it as is */
    s->buf[s->len - 1] = '\0';
    printf("%.1f %c %s\n", elapsed_ms(), s->tag, s->buf);
    s->len = 0;
  }
  fflush(stdout);
  return hit;
}

int main(int argc, char **argv) {
  const char *fifo = NULL /* the console file */, *pattern = NULL;
  int timeout_s = 120, opt;
  while ((opt = getopt(argc, argv, "f:u:t:")) != -1) {
    switch (opt) {
      case 'f': fifo = optarg; break;
      case 'u': pattern = optarg; break;
      case 't': timeout_s = atoi(optarg); break;
      default: goto usage;
    }
  }
  if (!pattern || optind >= argc) {
  usage:
    fprintf(stderr, "usage: boot-timer [-f FIFO] -u PATTERN [-t SECS] -- CMD [ARGS...]\n");
    return 2;
  }
  struct src srcs[2];
  int n = 0;
  if (fifo) {
    int file = open(fifo, O_RDONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (file < 0) { perror("open console file"); return 2; }
    int in = inotify_init1(IN_CLOEXEC);
    if (in < 0) { perror("inotify_init1"); return 2; }
    int wd = inotify_add_watch(in, fifo, IN_MODIFY);
    if (wd < 0) { perror("inotify_add_watch"); return 2; }
    srcs[n].fd = in; srcs[n].wd = wd; srcs[n].file = file; srcs[n].tag = 'c'; srcs[n].len = 0;
    n++;
  }
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) { perror("pipe"); return 2; }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  if (pid < 0) { perror("fork"); return 2; }
  if (pid == 0) {
    dup2(p[1], 1);
    execvp(argv[optind], argv + optind);
    perror("exec");
    _exit(127);
  }
  close(p[1]);
  srcs[n].fd = p[0]; srcs[n].wd = -1; srcs[n].file = -1; srcs[n].tag = 'o'; srcs[n].len = 0;
  n++;
  int hit = 0, open_srcs = n;
  while (!hit && open_srcs > 0) {
    struct pollfd pf[2];
    for (int i = 0; i < n; i++) { pf[i].fd = srcs[i].fd; pf[i].events = POLLIN; }
    int left = timeout_s * 1000 - (int)elapsed_ms();
    if (left <= 0) break;
    int r = poll(pf, n, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (int i = 0; i < n && !hit; i++) {
      if (srcs[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP))) continue;
      if (srcs[i].wd >= 0) {
        /* Consume the events, then read whatever the file gained. */
        char ev[4096];
        if (read(srcs[i].fd, ev, sizeof ev) <= 0) { srcs[i].fd = -1; open_srcs--; continue; }
        ssize_t got;
        while (!hit && (got = read(srcs[i].file, srcs[i].buf + srcs[i].len,
                                   sizeof srcs[i].buf - srcs[i].len)) > 0) {
          srcs[i].len += (size_t)got;
          hit = drain(&srcs[i], pattern);
        }
        continue;
      }
      ssize_t got = read(srcs[i].fd, srcs[i].buf + srcs[i].len, sizeof srcs[i].buf - srcs[i].len);
      if (got <= 0) { srcs[i].fd = -1; open_srcs--; continue; }
      srcs[i].len += (size_t)got;
      hit = drain(&srcs[i], pattern);
    }
  }
  if (hit) printf("%.1f UNTIL\n", elapsed_ms());
  else printf("%.1f TIMEOUT\n", elapsed_ms());
  fflush(stdout);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return hit ? 0 : 1;
}
