/* The raw TCP baselines on loopback: a round trip of a 22-byte message and a 14-byte answer
 * (a no-op command's and reply's sizes), and a one-way stream of MIB MiB.
 *   tcpbase rtt ITERS | stream MIB REPS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static void full(int fd, char *b, size_t n, int rd) {
    while (n) { ssize_t k = rd ? read(fd, b, n) : write(fd, b, n); if (k <= 0) { perror("io"); exit(1); } b += k; n -= k; }
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: tcpbase rtt ITERS | stream MIB REPS\n"); return 2; }
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) { perror("listen"); return 1; }
    int rtt = !strcmp(argv[1], "rtt");
    size_t bytes = rtt ? 0 : (size_t)atoi(argv[2]) << 20;
    int iters = rtt ? atoi(argv[2]) : (argc > 3 ? atoi(argv[3]) : 5);
    pid_t pid = fork();
    if (pid == 0) {
        int s = accept(ls, NULL, NULL);
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char buf[1 << 16];
        if (rtt) { for (int i = 0; i < iters + iters / 10; i++) { full(s, buf, 22, 1); full(s, buf, 14, 0); } }
        else { for (int i = 0; i < iters; i++) { size_t left = bytes; while (left) { size_t k = left < sizeof buf ? left : sizeof buf; full(s, buf, k, 1); left -= k; } full(s, buf, 1, 0); } }
        _exit(0);
    }
    int c = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c, (void *)&a, sizeof a)) { perror("connect"); return 1; }
    double *t = malloc(sizeof(double) * iters);
    char buf[1 << 16];
    memset(buf, 1, sizeof buf);
    if (rtt) {
        for (int i = 0; i < iters / 10; i++) { full(c, buf, 22, 0); full(c, buf, 14, 1); }
        for (int i = 0; i < iters; i++) { double t0 = now(); full(c, buf, 22, 0); full(c, buf, 14, 1); t[i] = (now() - t0) * 1e6; }
        qsort(t, iters, sizeof(double), cmp);
        printf("raw TCP round trip: median %.1f us, p99 %.1f us (%d runs)\n", t[iters / 2], t[iters * 99 / 100], iters);
    } else {
        for (int i = 0; i < iters; i++) {
            double t0 = now(); size_t left = bytes;
            while (left) { size_t k = left < sizeof buf ? left : sizeof buf; full(c, buf, k, 0); left -= k; }
            full(c, buf, 1, 1);
            t[i] = bytes / (now() - t0) / 1e9;
        }
        qsort(t, iters, sizeof(double), cmp);
        printf("raw TCP stream: %zu MiB %.2f GB/s (median of %d)\n", bytes >> 20, t[iters / 2], iters);
    }
    waitpid(pid, NULL, 0);
    return 0;
}
