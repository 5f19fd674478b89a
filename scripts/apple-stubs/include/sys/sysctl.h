// Stub of xnu's <sys/sysctl.h>: only sysctlbyname, for type-checking Baton's Apple code on Linux
// (glibc 2.32+ has no <sys/sysctl.h>). Source: apple-oss-distributions/xnu bsd/sys/sysctl.h.
#ifndef BATON_STUB_SYS_SYSCTL_H
#define BATON_STUB_SYS_SYSCTL_H
#include <stddef.h>

int     sysctlbyname(const char *, void *, size_t *, void *, size_t);

#endif
