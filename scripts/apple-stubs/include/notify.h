// Stub of Libnotify's <notify.h>, for type-checking Baton's Apple code on Linux.
// Signatures: the notify(3) manual page (developer.apple.com/library/archive/documentation/
//   System/Conceptual/ManPages_iPhoneOS/man3/notify.3.html; Libnotify's notify.3) and
//   developer.apple.com/documentation/darwinnotify.
// apple-oss-distributions/Libnotify (notify.h itself) is not in the index searched here.
// NOTIFY_STATUS_OK: the man page's success status; its value 0 is what Libnotify's own tests
//   (tests/notify_register_file_desc.c) and every caller compare against. Apple's documentation
//   page (developer.apple.com/documentation/darwinnotify/status-codes) lists it without a value.
// NOTIFY_REUSE: NOT declared: its value could not be found in an Apple source here, and Baton
//   does not call it. Add it with its source when the kernel layer needs it.
#ifndef BATON_STUB_NOTIFY_H
#define BATON_STUB_NOTIFY_H
#include <stdint.h>

#define NOTIFY_STATUS_OK 0

uint32_t notify_post(const char *name);
uint32_t notify_register_check(const char *name, int *out_token);
uint32_t notify_register_file_descriptor(const char *name, int *notify_fd, int flags, int *out_token);
uint32_t notify_check(int token, int *check);
uint32_t notify_set_state(int token, uint64_t state);
uint32_t notify_get_state(int token, uint64_t *state);
uint32_t notify_cancel(int token);

// notify_register_dispatch takes a dispatch queue and a block. Swift on Linux imports
// dispatch_queue_t as an opaque pointer, not as DispatchQueue, so the Swift stub module
// (swift/Darwin.swift) declares the Swift form Apple's SDK presents; C sees the C form.
#if !defined(__swift__) && defined(__BLOCKS__)
#include <dispatch/dispatch.h>
typedef void (^notify_handler_t)(int token);
uint32_t notify_register_dispatch(const char *name, int *out_token, dispatch_queue_t queue, notify_handler_t handler);
#endif

#endif
