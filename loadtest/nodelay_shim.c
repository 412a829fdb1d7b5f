/* LD_PRELOAD shim: TCP_NODELAY on every TCP socket the process accepts or connects.
 *
 * For peers that leave Nagle's algorithm on (sglang-router 0.3.2 on its client sockets):
 * a streamed reply's small last write then waits for the client's delayed ACK (~40 ms).
 * loadtest/procs.py compiles this on demand; the benchmark reports runs that used it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void set_nodelay(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int type = 0, one = 1;
    socklen_t tlen = sizeof type;
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM) return;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    int c = real(fd, addr, len);
    set_nodelay(c);
    return c;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    int c = real(fd, addr, len, flags);
    set_nodelay(c);
    return c;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    if (addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
        int type = 0, one = 1;
        socklen_t tlen = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM)
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return real(fd, addr, len);
}
