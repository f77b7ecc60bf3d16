// allocbench's malloc recorder: an LD_PRELOAD library that logs every malloc, calloc, realloc,
// reallocarray, free, posix_memalign, aligned_alloc, memalign, valloc and pvalloc of a process
// (and, through the inherited environment, of every process it starts) to a spool folder, for
// `allocbench cpu --record` to turn into a trace (docs/cpu-trace-format.md). Built by
// src/cpu/record.rs with g++ at first use.
//
// Why it looks like this:
// - The calls go on to the next malloc in the lookup order (dlsym(RTLD_NEXT)): glibc's, or an
//   allocator the program links (Debian's redis-server links jemalloc and calls its
//   malloc_usable_size and mallctl on what malloc gave, so its blocks must stay jemalloc's).
//   dlsym itself allocates: while the real functions are looked up, blocks come from a static
//   bootstrap buffer, never freed.
// - Each thread fills its own buffer of fixed 32-byte records and writes it whole with one
//   write(2) to the process's spool file (O_APPEND: concurrent chunks never interleave). A global
//   sequence number orders calls across threads: taken before a block is given back (free, the
//   old block of a realloc) and after one is handed out, so a block's reuse by another thread is
//   always numbered after its release.
// - A thread's buffer is written when full, when the thread exits, at exit/_exit/exec (every
//   thread's), and is discarded in a forked child (those records are the parent's).

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

using malloc_fn = void *(*)(size_t);
using calloc_fn = void *(*)(size_t, size_t);
using realloc_fn = void *(*)(void *, size_t);
using free_fn = void (*)(void *);
using memalign_fn = void *(*)(size_t, size_t);
using posix_memalign_fn = int (*)(void **, size_t, size_t);
using valloc_fn = void *(*)(size_t);

malloc_fn real_malloc;
calloc_fn real_calloc;
realloc_fn real_realloc;
free_fn real_free;
memalign_fn real_memalign;
memalign_fn real_aligned_alloc;
posix_memalign_fn real_posix_memalign;
valloc_fn real_valloc;
valloc_fn real_pvalloc;

// Blocks handed out while dlsym looks the real functions up (it calls calloc): 16-byte aligned,
// each after its size, never given back.
alignas(16) char g_bootstrap[1 << 16];
std::atomic<size_t> g_bootstrap_used{0};
std::atomic<int> g_resolving{0};

bool in_bootstrap(const void *p) {
    return p >= static_cast<const void *>(g_bootstrap) && p < static_cast<const void *>(g_bootstrap + sizeof g_bootstrap);
}

void *bootstrap_alloc(size_t bytes) {
    size_t need = (bytes + 16 + 15) & ~size_t(15);
    size_t at = g_bootstrap_used.fetch_add(need);
    if (at + need > sizeof g_bootstrap) return nullptr;
    std::memcpy(g_bootstrap + at, &bytes, sizeof bytes);
    return g_bootstrap + at + 16;
}

size_t bootstrap_size(const void *p) {
    size_t bytes;
    std::memcpy(&bytes, static_cast<const char *>(p) - 16, sizeof bytes);
    return bytes;
}

// Looks up the next malloc family once; false while the lookup itself is under way.
bool resolved() {
    if (real_free) return true;
    if (g_resolving.exchange(1)) return false;
    real_malloc = reinterpret_cast<malloc_fn>(dlsym(RTLD_NEXT, "malloc"));
    real_calloc = reinterpret_cast<calloc_fn>(dlsym(RTLD_NEXT, "calloc"));
    real_realloc = reinterpret_cast<realloc_fn>(dlsym(RTLD_NEXT, "realloc"));
    real_memalign = reinterpret_cast<memalign_fn>(dlsym(RTLD_NEXT, "memalign"));
    real_aligned_alloc = reinterpret_cast<memalign_fn>(dlsym(RTLD_NEXT, "aligned_alloc"));
    real_posix_memalign = reinterpret_cast<posix_memalign_fn>(dlsym(RTLD_NEXT, "posix_memalign"));
    real_valloc = reinterpret_cast<valloc_fn>(dlsym(RTLD_NEXT, "valloc"));
    real_pvalloc = reinterpret_cast<valloc_fn>(dlsym(RTLD_NEXT, "pvalloc"));
    free_fn f = reinterpret_cast<free_fn>(dlsym(RTLD_NEXT, "free"));
    __atomic_store_n(&real_free, f, __ATOMIC_RELEASE);
    return real_free != nullptr;
}

// Record kinds (the spool format's op codes; src/cpu/record.rs reads them).
enum Op : uint64_t { MALLOC = 1, CALLOC = 2, MEMALIGN = 3, FREE = 4, REALLOC_FROM = 5, REALLOC_TO = 6 };

struct Rec {
    uint64_t op_seq;  // op << 56 | log2(alignment) << 48 | sequence number
    uint64_t t_ns;    // CLOCK_MONOTONIC
    uint64_t ptr;     // the block handed out, or given back
    uint64_t bytes;   // what was asked for (calloc: nmemb * size)
};
static_assert(sizeof(Rec) == 32, "the spool format's record is 32 bytes");

constexpr uint32_t RECORDS_PER_BUFFER = 2046;  // with the header: 64 KiB

struct Buffer {
    std::atomic<int> lock;       // held while the buffer is written to or flushed
    std::atomic<int> owned;      // a live thread writes here
    uint32_t tid;
    uint32_t n;
    Buffer *next;                // every buffer ever made, for the flush at exit
    uint64_t pad[2];
    Rec recs[RECORDS_PER_BUFFER];
};

// Spool chunk header: one thread's records.
struct ChunkHeader {
    uint32_t magic;  // 'ABRC'
    uint32_t tid;
    uint32_t count;
    uint32_t reserved;
};
constexpr uint32_t CHUNK_MAGIC = 0x43524241;  // "ABRC" little-endian

std::atomic<uint64_t> g_seq{1};
std::atomic<Buffer *> g_buffers{nullptr};
std::atomic<int> g_fd{-1};
std::atomic<int> g_state{0};  // 0 not started, 1 starting, 2 recording, 3 off
std::atomic<int> g_final{0};  // from the exit flush on: every record is written at once
std::atomic<int> g_pid{0};    // the process the spool file is this one's for
pthread_key_t g_key;

__attribute__((tls_model("initial-exec"))) thread_local Buffer *t_buf = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local int t_busy = 0;
// Set while this thread holds its buffer's lock: a signal handler's _exit must not wait for it.
__attribute__((tls_model("initial-exec"))) thread_local int t_in_log = 0;

inline uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline void spin_lock(std::atomic<int> &l) {
    while (l.exchange(1, std::memory_order_acquire)) {
        while (l.load(std::memory_order_relaxed)) sched_yield();
    }
}
inline void spin_unlock(std::atomic<int> &l) { l.store(0, std::memory_order_release); }

void write_all(int fd, const void *p, size_t len) {
    const char *c = static_cast<const char *>(p);
    while (len > 0) {
        // The system call itself: write() is a cancellation point, and a cancel acted on here
        // would leave the buffer's lock held.
        ssize_t w = syscall(SYS_write, fd, c, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;  // a full disk loses records; the trace's counts show it
        c += w;
        len -= size_t(w);
    }
}

// Writes a locked buffer's records as one chunk (one write: O_APPEND keeps chunks whole).
void flush_locked(Buffer *b) {
    int fd = g_fd.load(std::memory_order_acquire);
    if (b->n == 0 || fd < 0) {
        b->n = 0;
        return;
    }
    // The header sits in the 16 bytes before the records (lock, owned, tid, n are rewritten
    // after): one write of header and records together.
    static_assert(offsetof(Buffer, recs) >= sizeof(ChunkHeader), "room for the header");
    char *at = reinterpret_cast<char *>(b->recs) - sizeof(ChunkHeader);
    ChunkHeader h{CHUNK_MAGIC, b->tid, b->n, 0};
    std::memcpy(at, &h, sizeof h);
    int saved = errno;
    write_all(fd, at, sizeof h + size_t(b->n) * sizeof(Rec));
    errno = saved;
    b->n = 0;
}

// Writes every thread's buffer. Not in a vfork child (it shares the parent's memory, and may have
// closed the parent's spool descriptor in its own table): those records are the parent's to
// write. Not this thread's own buffer while it is inside log() (an _exit from a signal handler).
void flush_all() {
    if (getpid() != g_pid.load()) return;
    for (Buffer *b = g_buffers.load(std::memory_order_acquire); b; b = b->next) {
        if (b == t_buf && t_in_log) continue;
        spin_lock(b->lock);
        flush_locked(b);
        spin_unlock(b->lock);
    }
}

// Opens this process's spool file: PID.N.spool in $ALLOCBENCH_RECORD_DIR (N counts the images
// an exec gives one pid), headed by the pid, the parent's pid and the command line.
void open_spool() {
    const char *dir = getenv("ALLOCBENCH_RECORD_DIR");
    if (!dir || !*dir) {
        g_state.store(3);
        return;
    }
    char path[4096];
    int fd = -1;
    pid_t pid = getpid();
    for (int n = 0; n < 1000 && fd < 0; n++) {
        snprintf(path, sizeof path, "%s/%d.%d.spool", dir, int(pid), n);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        g_state.store(3);
        return;
    }
    // Header: magic, version, pid, ppid, start (monotonic ns), command line length, command line.
    char cmdline[8192];
    ssize_t len = 0;
    int cfd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (cfd >= 0) {
        len = read(cfd, cmdline, sizeof cmdline);
        close(cfd);
        if (len < 0) len = 0;
    }
    struct {
        char magic[8];
        uint32_t version, pid, ppid, cmdline_len;
        uint64_t start_ns;
    } h = {{'A', 'B', 'R', 'S', 'P', 'O', 'O', 'L'}, 1, uint32_t(pid), uint32_t(getppid()), uint32_t(len), now_ns()};
    write_all(fd, &h, sizeof h);
    write_all(fd, cmdline, size_t(len));
    g_pid.store(int(pid));
    g_fd.store(fd, std::memory_order_release);
}

void thread_done(void *p) {
    Buffer *b = static_cast<Buffer *>(p);
    spin_lock(b->lock);
    flush_locked(b);
    b->owned.store(0, std::memory_order_release);
    spin_unlock(b->lock);
    // Calls from later destructors of this thread claim a buffer again (and this key's
    // destructor runs once more for it).
    t_buf = nullptr;
}

void after_fork_in_child() {
    // Every buffer's records are the parent's; the threads that owned them are gone (only this
    // one was copied). Locks held by those threads at the fork are released.
    for (Buffer *b = g_buffers.load(); b; b = b->next) {
        b->n = 0;
        b->lock.store(0);
        if (b != t_buf) b->owned.store(0);
    }
    if (t_buf) t_buf->tid = uint32_t(syscall(SYS_gettid));
    int fd = g_fd.exchange(-1);
    if (fd >= 0) close(fd);
    if (g_state.load() == 2) open_spool();
}

void at_exit() {
    // Final first: a record appended to a buffer this flush has passed is written at once.
    g_final.store(1);
    flush_all();
}

void start() {
    int expected = 0;
    if (!g_state.compare_exchange_strong(expected, 1)) return;
    t_busy++;
    resolved();
    pthread_key_create(&g_key, thread_done);
    pthread_atfork(nullptr, nullptr, after_fork_in_child);
    open_spool();
    if (g_state.load() == 1) {
        atexit(at_exit);
        g_state.store(2, std::memory_order_release);
    }
    t_busy--;
}

__attribute__((constructor(101))) void init() { start(); }

// This thread's buffer: a free one reused, else a fresh mapping (mmap never calls malloc).
Buffer *my_buffer() {
    if (t_buf) return t_buf;
    Buffer *b = nullptr;
    for (Buffer *c = g_buffers.load(std::memory_order_acquire); c && !b; c = c->next) {
        int zero = 0;
        if (c->owned.compare_exchange_strong(zero, 1)) b = c;
    }
    if (!b) {
        void *m = mmap(nullptr, sizeof(Buffer), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return nullptr;
        b = static_cast<Buffer *>(m);
        b->owned.store(1);
        Buffer *head = g_buffers.load();
        do {
            b->next = head;
        } while (!g_buffers.compare_exchange_weak(head, b));
    }
    spin_lock(b->lock);
    b->tid = uint32_t(syscall(SYS_gettid));
    b->n = 0;
    spin_unlock(b->lock);
    t_buf = b;
    pthread_setspecific(g_key, b);
    return b;
}

inline uint64_t next_seq() { return g_seq.fetch_add(1, std::memory_order_relaxed); }

// Appends a record (and, for a realloc, its pair) to this thread's buffer.
void log(Op op, uint64_t seq, uint64_t ptr, uint64_t bytes, unsigned align_log2, const Rec *first = nullptr) {
    if (g_state.load(std::memory_order_acquire) != 2) return;
    Buffer *b = my_buffer();
    if (!b) return;
    spin_lock(b->lock);
    t_in_log = 1;
    if (b->n + 2 > RECORDS_PER_BUFFER) flush_locked(b);
    if (first) b->recs[b->n++] = *first;
    b->recs[b->n++] = Rec{(uint64_t(op) << 56) | (uint64_t(align_log2) << 48) | seq, now_ns(), ptr, bytes};
    if (g_final.load()) flush_locked(b);
    t_in_log = 0;
    spin_unlock(b->lock);
}

unsigned log2_of(size_t align) {
    unsigned l = 0;
    while ((size_t(1) << l) < align && l < 63) l++;
    return l;
}

// A guard against re-entry: what the recorder itself calls (pthread, atexit, stdio) is passed
// through unrecorded.
struct Busy {
    bool outer;
    Busy() : outer(t_busy == 0) { t_busy++; }
    ~Busy() { t_busy--; }
};

unsigned page_log2() {
    return log2_of(size_t(sysconf(_SC_PAGESIZE)));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void *malloc(size_t bytes) {
    if (!resolved()) return bootstrap_alloc(bytes);
    Busy busy;
    void *p = real_malloc(bytes);
    if (p && busy.outer) log(MALLOC, next_seq(), uint64_t(p), bytes, 0);
    return p;
}

__attribute__((visibility("default"))) void *calloc(size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!resolved()) return bootstrap_alloc(bytes);  // zeroed: static, never reused
    Busy busy;
    void *p = real_calloc(n, size);
    if (p && busy.outer) log(CALLOC, next_seq(), uint64_t(p), bytes, 0);
    return p;
}

__attribute__((visibility("default"))) void free(void *p) {
    if (!p || in_bootstrap(p)) return;
    if (!resolved()) return;
    Busy busy;
    // Numbered before the block is given back: whoever gets it next is numbered after.
    uint64_t seq = busy.outer ? next_seq() : 0;
    real_free(p);
    if (busy.outer) log(FREE, seq, uint64_t(p), 0, 0);
}

__attribute__((visibility("default"))) void *realloc(void *old, size_t bytes) {
    if (!resolved()) {
        void *p = bootstrap_alloc(bytes);
        if (p && old) std::memcpy(p, old, bootstrap_size(old) < bytes ? bootstrap_size(old) : bytes);
        return p;
    }
    if (in_bootstrap(old)) {
        // A block from the lookup's time: copied into a real one (the copy is a malloc).
        void *p = malloc(bytes);
        if (p) std::memcpy(p, old, bootstrap_size(old) < bytes ? bootstrap_size(old) : bytes);
        return p;
    }
    Busy busy;
    uint64_t before = busy.outer ? next_seq() : 0;
    void *p = real_realloc(old, bytes);
    if (!busy.outer) return p;
    if (p) {
        Rec from{(uint64_t(REALLOC_FROM) << 56) | before, now_ns(), uint64_t(old), 0};
        log(REALLOC_TO, next_seq(), uint64_t(p), bytes, 0, &from);
    } else if (old && bytes == 0) {
        log(FREE, before, uint64_t(old), 0, 0);  // realloc(p, 0) freed p
    }
    return p;
}

__attribute__((visibility("default"))) void *reallocarray(void *old, size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return nullptr;
    }
    return realloc(old, bytes);
}

__attribute__((visibility("default"))) int posix_memalign(void **out, size_t align, size_t bytes) {
    if (!resolved()) return ENOMEM;
    Busy busy;
    int rc = real_posix_memalign(out, align, bytes);
    if (rc == 0 && busy.outer) log(MEMALIGN, next_seq(), uint64_t(*out), bytes, log2_of(align));
    return rc;
}

__attribute__((visibility("default"))) void *aligned_alloc(size_t align, size_t bytes) {
    if (!resolved()) return nullptr;
    Busy busy;
    void *p = real_aligned_alloc ? real_aligned_alloc(align, bytes) : real_memalign(align, bytes);
    if (p && busy.outer) log(MEMALIGN, next_seq(), uint64_t(p), bytes, log2_of(align));
    return p;
}

__attribute__((visibility("default"))) void *memalign(size_t align, size_t bytes) {
    if (!resolved()) return nullptr;
    Busy busy;
    void *p = real_memalign(align, bytes);
    if (p && busy.outer) log(MEMALIGN, next_seq(), uint64_t(p), bytes, log2_of(align));
    return p;
}

__attribute__((visibility("default"))) void *valloc(size_t bytes) {
    if (!resolved()) return nullptr;
    Busy busy;
    void *p = real_valloc ? real_valloc(bytes) : real_memalign(size_t(sysconf(_SC_PAGESIZE)), bytes);
    if (p && busy.outer) log(MEMALIGN, next_seq(), uint64_t(p), bytes, page_log2());
    return p;
}

__attribute__((visibility("default"))) void *pvalloc(size_t bytes) {
    if (!resolved()) return nullptr;
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    size_t rounded = (bytes + page - 1) & ~(page - 1);
    Busy busy;
    void *p = real_pvalloc ? real_pvalloc(bytes) : real_memalign(page, rounded);
    if (p && busy.outer) log(MEMALIGN, next_seq(), uint64_t(p), rounded, page_log2());
    return p;
}

// _exit skips atexit: multiprocessing's children and os._exit end this way.
__attribute__((visibility("default"))) void _exit(int status) {
    flush_all();
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}
__attribute__((visibility("default"))) void _Exit(int status) { _exit(status); }

// An exec replaces the image and its unwritten buffers: they are written first. The real calls
// are looked up at each use (dlsym is cheap next to an exec; no C++ runtime for static guards).
using execve_fn = int (*)(const char *, char *const[], char *const[]);
__attribute__((visibility("default"))) int execve(const char *path, char *const argv[], char *const envp[]) {
    flush_all();
    auto real = reinterpret_cast<execve_fn>(dlsym(RTLD_NEXT, "execve"));
    return real(path, argv, envp);
}
using execv_fn = int (*)(const char *, char *const[]);
__attribute__((visibility("default"))) int execv(const char *path, char *const argv[]) {
    flush_all();
    auto real = reinterpret_cast<execv_fn>(dlsym(RTLD_NEXT, "execv"));
    return real(path, argv);
}
__attribute__((visibility("default"))) int execvp(const char *file, char *const argv[]) {
    flush_all();
    auto real = reinterpret_cast<execv_fn>(dlsym(RTLD_NEXT, "execvp"));
    return real(file, argv);
}
__attribute__((visibility("default"))) int execvpe(const char *file, char *const argv[], char *const envp[]) {
    flush_all();
    auto real = reinterpret_cast<execve_fn>(dlsym(RTLD_NEXT, "execvpe"));
    return real(file, argv, envp);
}

// glibc's execl family calls its internal execve: each is answered here through the wrappers
// above, so the buffers are written first. The argument list is copied to the stack.
namespace {
constexpr int MAX_EXECL_ARGS = 4096;
int collect(const char *arg0, va_list ap, char **argv) {
    int n = 0;
    argv[n++] = const_cast<char *>(arg0);
    while (argv[n - 1] && n < MAX_EXECL_ARGS) argv[n++] = va_arg(ap, char *);
    if (argv[n - 1]) {
        errno = E2BIG;
        return -1;
    }
    return n;
}
}  // namespace

__attribute__((visibility("default"))) int execl(const char *path, const char *arg, ...) {
    char *argv[MAX_EXECL_ARGS];
    va_list ap;
    va_start(ap, arg);
    int n = collect(arg, ap, argv);
    va_end(ap);
    return n < 0 ? -1 : execv(path, argv);
}
__attribute__((visibility("default"))) int execlp(const char *file, const char *arg, ...) {
    char *argv[MAX_EXECL_ARGS];
    va_list ap;
    va_start(ap, arg);
    int n = collect(arg, ap, argv);
    va_end(ap);
    return n < 0 ? -1 : execvp(file, argv);
}
__attribute__((visibility("default"))) int execle(const char *path, const char *arg, ...) {
    char *argv[MAX_EXECL_ARGS];
    va_list ap;
    va_start(ap, arg);
    int n = collect(arg, ap, argv);
    char *const *envp = n < 0 ? nullptr : va_arg(ap, char *const *);
    va_end(ap);
    return n < 0 ? -1 : execve(path, argv, envp);
}

}  // extern "C"
