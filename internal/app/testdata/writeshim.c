// writeshim is an LD_PRELOAD library for csid's tests of a host tool
// (resize2fs) that is slowed down or killed in the middle of its work. It
// counts the tool's writes to block devices (write, pwrite, pwritev...;
// libext2fs writes with pwrite64) and, as the environment asks:
//
//   SHIM_STARTED=path   creates path at the first write: the tool is at work
//   SHIM_DELAY_US=n     sleeps n microseconds before each write
//   SHIM_KILL_AT=n      before the n-th write, SIGKILLs the tool's process
//                       group (csid and its children, as a container dies)
//   SHIM_DONE=path      when the tool exits normally, writes its write count
//                       to path (nothing when it is killed)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long writes;

static void tick(int fd) {
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISBLK(st.st_mode))
		return;
	writes++;
	const char *started = getenv("SHIM_STARTED");
	if (writes == 1 && started) {
		int f = open(started, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		if (f >= 0)
			close(f);
	}
	const char *kill_at = getenv("SHIM_KILL_AT");
	if (kill_at && writes >= atol(kill_at))
		kill(0, SIGKILL);
	const char *delay = getenv("SHIM_DELAY_US");
	if (delay)
		usleep(atol(delay));
}

__attribute__((destructor)) static void done(void) {
	const char *path = getenv("SHIM_DONE");
	if (!path)
		return;
	FILE *f = fopen(path, "we");
	if (f) {
		fprintf(f, "%ld\n", writes);
		fclose(f);
	}
}

#define REAL(name, ret, ...)                                                   \
	static ret (*real)(__VA_ARGS__);                                       \
	if (!real)                                                             \
		real = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

ssize_t write(int fd, const void *b, size_t n) {
	REAL("write", ssize_t, int, const void *, size_t);
	tick(fd);
	return real(fd, b, n);
}

ssize_t pwrite(int fd, const void *b, size_t n, off_t o) {
	REAL("pwrite", ssize_t, int, const void *, size_t, off_t);
	tick(fd);
	return real(fd, b, n, o);
}

ssize_t pwrite64(int fd, const void *b, size_t n, off64_t o) {
	REAL("pwrite64", ssize_t, int, const void *, size_t, off64_t);
	tick(fd);
	return real(fd, b, n, o);
}

ssize_t writev(int fd, const struct iovec *v, int c) {
	REAL("writev", ssize_t, int, const struct iovec *, int);
	tick(fd);
	return real(fd, v, c);
}

ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) {
	REAL("pwritev", ssize_t, int, const struct iovec *, int, off_t);
	tick(fd);
	return real(fd, v, c, o);
}

ssize_t pwritev2(int fd, const struct iovec *v, int c, off_t o, int flags) {
	REAL("pwritev2", ssize_t, int, const struct iovec *, int, off_t, int);
	tick(fd);
	return real(fd, v, c, o, flags);
}
