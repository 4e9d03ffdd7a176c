/* The raw TCP baselines: a round trip of a 22-byte message and a 14-byte answer (a no-op
 * command's and reply's sizes), and a one-way stream of MIB MiB, each as a median.
 *   tcpbase [OPTIONS] rtt ITERS | stream MIB REPS
 * Options (for a veth pair between two network namespaces; default: both ends on loopback):
 *   --addr IP              address the server listens on and the client connects to
 *   --server-netns NAME    the server end runs in network namespace NAME (/run/netns/NAME)
 *   --client-netns NAME    the client end runs in network namespace NAME
 * The server end is a forked child; it enters its namespace before it creates its socket and
 * tells the parent the port through a pipe, so one process measures across two namespaces. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Longest wait for any single read or write: a lost peer is an error, never a hang. */
#define IO_TIMEOUT_MS 20000

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static void die(const char *what) { perror(what); exit(1); }

static void full(int fd, char *b, size_t n, int rd) {
    while (n) {
        struct pollfd p = { fd, rd ? POLLIN : POLLOUT, 0 };
        int r = poll(&p, 1, IO_TIMEOUT_MS);
        if (r == 0) { fprintf(stderr, "tcpbase: no progress for %d ms\n", IO_TIMEOUT_MS); exit(1); }
        if (r < 0) die("poll");
        ssize_t k = rd ? read(fd, b, n) : write(fd, b, n);
        if (k <= 0) { if (k == 0) fprintf(stderr, "tcpbase: peer closed\n"); else perror("io"); exit(1); }
        b += k; n -= (size_t)k;
    }
}

static void enter_netns(const char *name) {
    if (!name) return;
    char path[512];
    snprintf(path, sizeof path, "/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(path);
    if (setns(fd, CLONE_NEWNET)) die("setns");
    close(fd);
}

static void usage(void) {
    fprintf(stderr, "usage: tcpbase [--addr IP] [--server-netns NAME] [--client-netns NAME] rtt ITERS | stream MIB REPS\n");
    exit(2);
}

static int positive(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v <= 0 || v > 1000000) { fprintf(stderr, "tcpbase: '%s' is not a count in 1..1000000\n", s); exit(2); }
    return (int)v;
}

/* The server end: one connection; answers round trips or drains streams, acking each. */
static void serve(int ls, int rtt, size_t bytes, int iters) {
    int one = 1, s = accept(ls, NULL, NULL);
    if (s < 0) die("accept");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    static char buf[1 << 16];
    if (rtt) { for (int i = 0; i < iters + iters / 10; i++) { full(s, buf, 22, 1); full(s, buf, 14, 0); } }
    else { for (int i = 0; i < iters; i++) { size_t left = bytes; while (left) { size_t k = left < sizeof buf ? left : sizeof buf; full(s, buf, k, 1); left -= k; } full(s, buf, 1, 0); } }
}

int main(int argc, char **argv) {
    const char *ip = "127.0.0.1", *server_ns = NULL, *client_ns = NULL;
    int i = 1;
    for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
        if (!strcmp(argv[i], "--addr")) ip = argv[i + 1];
        else if (!strcmp(argv[i], "--server-netns")) server_ns = argv[i + 1];
        else if (!strcmp(argv[i], "--client-netns")) client_ns = argv[i + 1];
        else usage();
    }
    if (argc - i < 2 || (strcmp(argv[i], "rtt") && strcmp(argv[i], "stream"))) usage();
    int rtt = !strcmp(argv[i], "rtt");
    size_t bytes = rtt ? 0 : (size_t)positive(argv[i + 1]) << 20;
    int iters = rtt ? positive(argv[i + 1]) : (argc - i > 2 ? positive(argv[i + 2]) : 5);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) { fprintf(stderr, "tcpbase: bad address %s\n", ip); return 2; }

    int port_pipe[2];
    if (pipe(port_pipe)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        enter_netns(server_ns);
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        socklen_t al = sizeof a;
        if (ls < 0 || bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) die("listen");
        if (write(port_pipe[1], &a.sin_port, sizeof a.sin_port) != sizeof a.sin_port) die("write port");
        serve(ls, rtt, bytes, iters);
        _exit(0);
    }
    close(port_pipe[1]);
    struct pollfd pp = { port_pipe[0], POLLIN, 0 };
    if (poll(&pp, 1, IO_TIMEOUT_MS) != 1 || read(port_pipe[0], &a.sin_port, sizeof a.sin_port) != sizeof a.sin_port) {
        fprintf(stderr, "tcpbase: the server end did not start\n");
        kill(pid, SIGKILL); waitpid(pid, NULL, 0);
        return 1;
    }
    enter_netns(client_ns);
    int one = 1, c = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (c < 0 || connect(c, (void *)&a, sizeof a)) { perror("connect"); kill(pid, SIGKILL); waitpid(pid, NULL, 0); return 1; }
    double *t = malloc(sizeof(double) * (size_t)iters);
    static char buf[1 << 16];
    memset(buf, 1, sizeof buf);
    if (rtt) {
        for (int j = 0; j < iters / 10; j++) { full(c, buf, 22, 0); full(c, buf, 14, 1); }
        for (int j = 0; j < iters; j++) { double t0 = now(); full(c, buf, 22, 0); full(c, buf, 14, 1); t[j] = (now() - t0) * 1e6; }
        qsort(t, (size_t)iters, sizeof(double), cmp);
        printf("raw TCP round trip: median %.1f us, p99 %.1f us (%d runs)\n", t[iters / 2], t[iters * 99 / 100], iters);
    } else {
        for (int j = 0; j < iters; j++) {
            double t0 = now(); size_t left = bytes;
            while (left) { size_t k = left < sizeof buf ? left : sizeof buf; full(c, buf, k, 0); left -= k; }
            full(c, buf, 1, 1);
            t[j] = bytes / (now() - t0) / 1e9;
        }
        qsort(t, (size_t)iters, sizeof(double), cmp);
        printf("raw TCP stream: %zu MiB %.2f GB/s (median of %d)\n", bytes >> 20, t[iters / 2], iters);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
