// Linux-only: Apple has no inotify (use kqueue EVFILT_VNODE). glibc's header is still read
// (Swift's Glibc module includes it), but every function is declared unavailable first (Swift
// reads the first declaration).
#ifndef BATON_STUB_APPLE_INOTIFY_H
#define BATON_STUB_APPLE_INOTIFY_H
#include <stdint.h>
int inotify_init(void) __attribute__((unavailable("not in Apple's SDK: use kqueue (EVFILT_VNODE)")));
int inotify_init1(int) __attribute__((unavailable("not in Apple's SDK: use kqueue (EVFILT_VNODE)")));
int inotify_add_watch(int, const char *, uint32_t) __attribute__((unavailable("not in Apple's SDK: use kqueue (EVFILT_VNODE)")));
int inotify_rm_watch(int, int) __attribute__((unavailable("not in Apple's SDK: use kqueue (EVFILT_VNODE)")));
#endif
#include_next <sys/inotify.h>
