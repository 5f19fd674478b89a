// Marks Linux-only <unistd.h> functions unavailable for the Apple check, in C and (through the
// clang importer) in Swift: Apple's <unistd.h> does not declare them. Declared before glibc's
// header, so the first declaration carries `unavailable` (Swift reads the first one).
#ifndef BATON_STUB_APPLE_UNISTD_H
#define BATON_STUB_APPLE_UNISTD_H
int fdatasync(int) __attribute__((unavailable("not in Apple's SDK: use fcntl(F_FULLFSYNC) or fsync")));
int pipe2(int *, int) __attribute__((unavailable("not in Apple's SDK: use pipe, then fcntl(FD_CLOEXEC)")));
int dup3(int, int, int) __attribute__((unavailable("not in Apple's SDK: use dup2, then fcntl(FD_CLOEXEC)")));
#endif
#include_next <unistd.h>
// syscall(2): only in Baton's shim text (the toolchain's own Linux shims use it). C checks
// this later declaration; Swift never imports variadic functions.
#if defined(BATON_APPLE_CHECK_SHIM) && !defined(BATON_STUB_APPLE_SYSCALL)
#define BATON_STUB_APPLE_SYSCALL
long syscall(long, ...) __attribute__((unavailable("not in Apple's SDK: Linux system-call numbers")));
#endif
