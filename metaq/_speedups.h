/* What the two C files of metaq._speedups share. */
#ifndef METAQ_SPEEDUPS_H
#define METAQ_SPEEDUPS_H

#include <Python.h>

/* The SyncWorker type (_syncworker.c), registered by the module's init (_speedups.c). */
extern PyTypeObject SyncWorkerType;

#endif
