/* Whether another thread of this process is running right now (part of nvdispatch._hotpath; _hotpath.c adds
 * this function).
 *
 * running_threads() -> int | None: how many threads of this process other than the caller are running or
 * waiting for a CPU (state R in /proc/self/task/<tid>/stat), None where that cannot be read (no /proc: another
 * OS). The CPU linear layer asks before a call whose engine was calibrated two ways (numpy_matmul_contended):
 * an engine starting threads of its own loses a core to such a thread (a BLAS worker still spinning after its
 * last call, a user's busy thread), the BLAS's own threading does not lose as much.
 *
 * Why the states and not CPU clocks: the process's CPU clock gains the time of threads running on other CPUs
 * only at the scheduler's ticks and switches, so a window short enough to be cheap may see nothing; the
 * threads' own clocks are exact but a thread waiting for the GIL the caller holds runs at once when the call
 * lets the GIL go, and gains nothing while the caller looks. A BLAS worker spinning on sched_yield and a thread
 * in compiled code read R; a thread of pure Python code reads R until it is back waiting for the GIL (before
 * most calls of a long engine, never in a tight loop of looks: docs/notes/cpu-matmul.md). One look costs a
 * directory read and one small read per thread (microseconds each), and holds the GIL throughout.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__linux__)
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* the threads other than the caller in state R, or -1 where /proc/self/task cannot be read */
static int
nvd_running_threads(void)
{
    int dirfd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return -1;
    DIR *dir = fdopendir(dirfd);
    if (dir == NULL) {
        close(dirfd);
        return -1;
    }
    char self[32];
    snprintf(self, sizeof(self), "%ld", (long)syscall(SYS_gettid));
    int running = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9' || strcmp(entry->d_name, self) == 0)
            continue;
        char path[300], stat[512];
        snprintf(path, sizeof(path), "%s/stat", entry->d_name);
        int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* (a thread that ended meanwhile) */
        ssize_t got = read(fd, stat, sizeof(stat) - 1);
        close(fd);
        if (got <= 0)
            continue;
        stat[got] = '\0';
        /* "tid (comm) S ...": the name may hold spaces and parentheses, the state follows the last ')' */
        char *end = strrchr(stat, ')');
        if (end == NULL || end[1] != ' ')
            continue;
        running += end[2] == 'R';
    }
    closedir(dir); /* (closes dirfd) */
    return running;
}
#else
static int
nvd_running_threads(void)
{
    return -1;
}
#endif

static PyObject *
running_threads(PyObject *module, PyObject *unused)
{
    int running = nvd_running_threads();
    if (running < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(running);
}

static PyMethodDef cores_methods[] = {
    {"running_threads", running_threads, METH_NOARGS,
     "running_threads() -> int | None: the threads of this process other than the caller that are running or "
     "waiting for a CPU right now (/proc/self/task/*/stat state R); None where the OS does not say"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_cores(PyObject *module)
{
    return PyModule_AddFunctions(module, cores_methods);
}
