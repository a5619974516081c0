/* Guest side of `cargo bench -p voidbox --bench net` (built static with gcc on the host).
 *
 *   netbench tput IP PORT MIB   send MIB MiB ('T' first), half-close, wait for "OK";
 *                               prints the elapsed microseconds
 *   netbench rr IP PORT N       N times: connect, send "G\n", read the reply to EOF, close;
 *                               prints each round trip in microseconds, one per line
 *   netbench local tput MIB | local rr N
 *                               the same against a server forked on the guest's own loopback
 *
 * The server protocol (this file's `serve`, and the bench's host server): first byte 'T' →
 * read to EOF, answer "OK", close; 'G' → answer 128 bytes, close.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char buf[65536];

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static int dial(const char *ip, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) { fprintf(stderr, "bad ip %s\n", ip); exit(2); }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); exit(1); }
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
}

static void write_all(int s, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(s, p, n);
        if (w <= 0) { perror("write"); exit(1); }
        p += w; n -= (size_t)w;
    }
}

static size_t read_to_eof(int s) {
    size_t total = 0;
    for (;;) {
        ssize_t r = read(s, buf, sizeof buf);
        if (r < 0) { perror("read"); exit(1); }
        if (r == 0) return total;
        total += (size_t)r;
    }
}

static int tput(const char *ip, int port, long mib) {
    long long t0 = now_us();
    int s = dial(ip, port);
    write_all(s, "T", 1);
    memset(buf, 'x', sizeof buf);
    for (long i = 0; i < mib * 16; i++) write_all(s, buf, sizeof buf);
    shutdown(s, SHUT_WR);
    size_t got = read_to_eof(s);
    close(s);
    if (got != 2) { fprintf(stderr, "no OK from the server\n"); return 1; }
    printf("%lld\n", now_us() - t0);
    return 0;
}

static int rr(const char *ip, int port, long n) {
    for (long i = 0; i < n; i++) {
        long long t0 = now_us();
        int s = dial(ip, port);
        write_all(s, "G\n", 2);
        size_t got = read_to_eof(s);
        close(s);
        if (got != 128) { fprintf(stderr, "short reply (%zu bytes)\n", got); return 1; }
        printf("%lld\n", now_us() - t0);
    }
    return 0;
}

static void serve(int ls) {
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) continue;
        char k;
        if (read(c, &k, 1) == 1) {
            if (k == 'T') { read_to_eof(c); write_all(c, "OK", 2); }
            else { memset(buf, 'r', 128); (void)read(c, buf + 128, 2); write_all(c, buf, 128); }
        }
        close(c);
    }
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "tput")) return tput(argv[2], atoi(argv[3]), atol(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "rr")) return rr(argv[2], atoi(argv[3]), atol(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "local")) {
        int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 64) < 0 ||
            getsockname(ls, (struct sockaddr *)&a, &len) < 0) { perror("listen"); return 1; }
        pid_t child = fork();
        if (child == 0) serve(ls);
        close(ls);
        int port = ntohs(a.sin_port), rc;
        if (!strcmp(argv[2], "tput")) rc = tput("127.0.0.1", port, atol(argv[3]));
        else rc = rr("127.0.0.1", port, atol(argv[3]));
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return rc;
    }
    fprintf(stderr, "usage: netbench tput|rr IP PORT N | netbench local tput|rr N\n");
    return 2;
}
