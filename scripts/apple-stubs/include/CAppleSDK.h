// Umbrella of the transcribed Apple C declarations, re-exported by the Darwin stub module.
#include <fcntl.h>
#include <spawn.h>
#include <time.h>
#include <pthread.h>
#include <notify.h>
#include <sys/event.h>
#include <sys/sysctl.h>
#include <os/os_sync_wait_on_address.h>
