// readshim is an LD_PRELOAD library for csid's test of the blank check: it
// records where a program (blkid) reads block devices. Each read of a
// block device (read, pread, readv, preadv...; libblkid seeks and reads)
// appends "offset length" to the file SHIM_READS names.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static void note(int fd, off_t off, size_t n) {
	struct stat st;
	const char *path = getenv("SHIM_READS");
	if (!path || fstat(fd, &st) != 0 || !S_ISBLK(st.st_mode))
		return;
	FILE *f = fopen(path, "ae");
	if (!f)
		abort(); /* a read not recorded would pass the test unseen */
	fprintf(f, "%lld %zu\n", (long long)off, n);
	fclose(f);
}

static size_t total(const struct iovec *v, int c) {
	size_t n = 0;
	for (int i = 0; i < c; i++)
		n += v[i].iov_len;
	return n;
}

#define REAL(name, ret, ...)                                                   \
	static ret (*real)(__VA_ARGS__);                                       \
	if (!real)                                                             \
		real = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

ssize_t read(int fd, void *b, size_t n) {
	REAL("read", ssize_t, int, void *, size_t);
	note(fd, lseek(fd, 0, SEEK_CUR), n);
	return real(fd, b, n);
}

ssize_t pread(int fd, void *b, size_t n, off_t o) {
	REAL("pread", ssize_t, int, void *, size_t, off_t);
	note(fd, o, n);
	return real(fd, b, n, o);
}

ssize_t pread64(int fd, void *b, size_t n, off64_t o) {
	REAL("pread64", ssize_t, int, void *, size_t, off64_t);
	note(fd, o, n);
	return real(fd, b, n, o);
}

/* What fortified callers call instead of read and pread. */
ssize_t __read_chk(int fd, void *b, size_t n, size_t buflen) {
	REAL("__read_chk", ssize_t, int, void *, size_t, size_t);
	note(fd, lseek(fd, 0, SEEK_CUR), n);
	return real(fd, b, n, buflen);
}

ssize_t __pread_chk(int fd, void *b, size_t n, off_t o, size_t buflen) {
	REAL("__pread_chk", ssize_t, int, void *, size_t, off_t, size_t);
	note(fd, o, n);
	return real(fd, b, n, o, buflen);
}

ssize_t __pread64_chk(int fd, void *b, size_t n, off64_t o, size_t buflen) {
	REAL("__pread64_chk", ssize_t, int, void *, size_t, off64_t, size_t);
	note(fd, o, n);
	return real(fd, b, n, o, buflen);
}

ssize_t readv(int fd, const struct iovec *v, int c) {
	REAL("readv", ssize_t, int, const struct iovec *, int);
	note(fd, lseek(fd, 0, SEEK_CUR), total(v, c));
	return real(fd, v, c);
}

ssize_t preadv(int fd, const struct iovec *v, int c, off_t o) {
	REAL("preadv", ssize_t, int, const struct iovec *, int, off_t);
	note(fd, o, total(v, c));
	return real(fd, v, c, o);
}

ssize_t preadv2(int fd, const struct iovec *v, int c, off_t o, int flags) {
	REAL("preadv2", ssize_t, int, const struct iovec *, int, off_t, int);
	note(fd, o, total(v, c));
	return real(fd, v, c, o, flags);
}
