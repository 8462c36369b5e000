// The emulated GPU's scheduler: every CUDA thread of a launch runs as a fiber (its own stack) on
// the calling host thread, and a fiber switches out only at a barrier (__syncthreads, a warp
// shuffle or vote, the cluster barrier), so what runs between two barriers is one thread's code
// run to the barrier, as on a GPU that happened to schedule it so.  The model is ROCm's HIP-CPU
// (a fiber per thread, round-robin to the barrier, a per-warp scratchpad for shuffles).
//
// Blocks run a cluster at a time (a launch without clusters is clusters of one block): all the
// threads of a cluster's blocks are live together, so a cluster barrier and a peer block's shared
// memory (distributed shared memory) work as written.  A cooperative launch runs all its blocks
// together, so the grid barrier (cooperative groups' grid.sync()) works as written too.  Shared
// memory, static and dynamic, is an arena per block filled with NaN bytes when the block starts,
// checked against the per-block limit. A barrier that not every thread of its scope (warp, block,
// cluster, grid) reaches is an error naming the kernel, not a hang; an exception inside a fiber (a
// failed check) ends the launch and reaches the caller.
//
// Included by lltm_runtime.cuh under LLTM_CUDA_EMULATE only.
#pragma once

#include <torch/headeronly/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
// What a kernel reads to know which thread it is: set by the scheduler before each fiber resumes.
// thread_local: two host threads may each run an emulated launch at once.
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;

namespace lltm_cuda::rt::emu {

constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = 256 * 1024;  // a kernel's frames plus a thrown check's unwinding
constexpr size_t kGuardBytes = 4096;         // an overflow faults instead of corrupting a neighbour

// ---- The switch between fibers -----------------------------------------------------------------
// The stack a context runs on, for AddressSanitizer: a build with ASan announces every switch, so
// ASan knows which stack is running (a check thrown in a fiber unwinds a stack it knows, and its
// frames' redzones are tracked there) and keeps each fiber's fake stack apart.
struct StackRange {
  const void* bottom = nullptr;  // the host thread's stack: learnt from the first switch away from it
  size_t size = 0;
  void* fake = nullptr;  // ASan's fake stack of this context while another runs
};

#if defined(__x86_64__)
// Saves the callee-saved registers and the FPU/SSE control words on the current stack, stores the
// stack pointer in *save and resumes the stack at `load`: no system call (glibc's swapcontext makes
// one to save the signal mask on every switch).
__attribute__((naked, noinline)) inline void switch_stack(void** /*save*/, void* /*load*/) {
  asm volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "subq $16, %rsp\n\tstmxcsr 8(%rsp)\n\tfnstcw (%rsp)\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "fldcw (%rsp)\n\tldmxcsr 8(%rsp)\n\taddq $16, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}

// A new fiber's first switch lands here: r12 holds its argument, r13 the function (which never returns).
__attribute__((naked, noinline)) inline void fiber_entry() {
  asm volatile("movq %r12, %rdi\n\tcallq *%r13\n\tud2\n\t");
}

struct Context {
  void* sp = nullptr;
  StackRange stack;
};

// Writes the frame switch_stack pops onto a fresh stack, so the first switch to it calls run(arg).
inline void make_context(Context& ctx, char* stack_top, void (*run)(void*), void* arg) {
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t(15)) - 2;
  uint64_t* frame = top - 9;  // control words, r15, r14, r13, r12, rbx, rbp, return address
  uint32_t mxcsr = 0;
  uint16_t fcw = 0;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fcw));
  std::memset(frame, 0, 9 * sizeof(uint64_t));
  std::memcpy(&frame[0], &fcw, sizeof fcw);
  std::memcpy(reinterpret_cast<char*>(&frame[1]), &mxcsr, sizeof mxcsr);
  frame[4] = reinterpret_cast<uint64_t>(run);  // r13
  frame[5] = reinterpret_cast<uint64_t>(arg);  // r12
  frame[8] = reinterpret_cast<uint64_t>(&fiber_entry);
  ctx.sp = frame;
  ctx.stack = StackRange{stack_top - (kStackBytes - kGuardBytes), kStackBytes - kGuardBytes};
}

inline void raw_switch(Context& from, Context& to) { switch_stack(&from.sp, to.sp); }
#else
// Elsewhere ucontext, system call and all: correct, only slower.
struct Context {
  ucontext_t uc;
  StackRange stack;
};

inline void make_context(Context& ctx, char* stack_top, void (*run)(void*), void* arg) {
  getcontext(&ctx.uc);
  ctx.uc.uc_stack.ss_sp = stack_top - (kStackBytes - kGuardBytes);
  ctx.uc.uc_stack.ss_size = kStackBytes - kGuardBytes;
  ctx.uc.uc_link = nullptr;
  makecontext(&ctx.uc, reinterpret_cast<void (*)()>(run), 1, arg);  // one pointer argument (glibc passes 64 bits)
  ctx.stack = StackRange{ctx.uc.uc_stack.ss_sp, ctx.uc.uc_stack.ss_size};
}

inline void raw_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// Back on `self`'s stack after a switch: tells ASan so, and returns the range of the stack left.
inline StackRange arrived(Context& self) {
  StackRange left;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(self.stack.fake, &left.bottom, &left.size);
#else
  (void)self;
#endif
  return left;
}

// Suspends `from` and resumes `to`; returns when something switches back to `from`.  A context that
// `ends` is never resumed: ASan frees its fake stack.
inline void switch_context(Context& from, Context& to, bool ends = false) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(ends ? nullptr : &from.stack.fake, to.stack.bottom, to.stack.size);
#else
  (void)ends;
#endif
  raw_switch(from, to);
  arrived(from);
}

// A stack mapped once and reused by every later launch on this host thread (a guard page below).
struct Stack {
  char* base = nullptr;
  Stack() {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    STD_TORCH_CHECK(p != MAP_FAILED, "lltm-cuda (emulated): cannot map a fiber stack");
    base = static_cast<char*>(p);
    mprotect(base, kGuardBytes, PROT_NONE);
  }
  ~Stack() { munmap(base, kStackBytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  // The top of the stack for a new fiber.  Built with AddressSanitizer, the frames of the fiber
  // that ran here before left their redzones poisoned: cleared, as a new thread's stack would be.
  char* top() const {
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(base + kGuardBytes, kStackBytes - kGuardBytes);
#endif
    return base + kStackBytes;
  }
};

// ---- One launch ----------------------------------------------------------------------------------
enum class Wait { kNone, kWarp, kBlock, kCluster, kGrid, kDone };

inline const char* describe(Wait w) {
  switch (w) {
    case Wait::kWarp: return "a warp shuffle/vote";
    case Wait::kBlock: return "__syncthreads";
    case Wait::kCluster: return "the cluster barrier";
    case Wait::kGrid: return "the grid barrier";
    case Wait::kDone: return "exited";
    default: return "running";
  }
}

struct Fiber {
  Context context;
  int block = 0;        // its block among those live together (its cluster rank, in a cluster)
  unsigned thread = 0;  // threadIdx.x
  dim3 block_index;     // blockIdx
  Wait wait = Wait::kNone;
  size_t static_cursor = 0;  // bytes of static shared memory its declarations have taken so far
};

struct BlockState {
  unsigned char* shared = nullptr;  // the arena: dynamic shared memory first, then the static declarations
  size_t filled = 0;                // bytes filled with NaN so far
  std::vector<uint64_t> scratch;    // one slot a thread: the warps' shuffle/vote scratchpad
};

// Where an emulated launch's threads are, for the rt:: device functions and the scheduler.
struct Launch {
  const char* name;
  void (*body)(void*);
  void* closure;
  unsigned threads = 0, cluster = 1;
  unsigned live = 1;         // blocks live together: a cluster, or a cooperative launch's whole grid
  bool cooperative = false;  // a cooperative launch: the grid barrier is allowed
  size_t dynamic_bytes = 0, shared_limit = 0;
  std::vector<Fiber> fibers;  // live * threads, block-major
  std::vector<BlockState> blocks;
  Fiber* current = nullptr;
  Context scheduler;
  std::exception_ptr error;
};

inline thread_local Launch* current_launch = nullptr;

inline Launch& launch_state() {
  STD_TORCH_CHECK(current_launch != nullptr, "lltm-cuda (emulated): a device function was called outside a launch");
  return *current_launch;
}

// Per host thread: the stacks and the shared-memory arenas, kept for the next launch.
struct Pool {
  std::vector<std::unique_ptr<Stack>> stacks;
  std::vector<std::vector<unsigned char>> arenas;
};

inline Pool& pool() {
  static thread_local Pool p;
  return p;
}

inline void fiber_main(void* arg) {
  Launch& L = *current_launch;
  Fiber& f = *static_cast<Fiber*>(arg);
  // Every fiber starts from the scheduler, which runs on the host thread's own stack: its range.
  const StackRange host = arrived(f.context);
  L.scheduler.stack.bottom = host.bottom;
  L.scheduler.stack.size = host.size;
  try {
    L.body(L.closure);
  } catch (...) {
    if (!L.error) {
      L.error = std::current_exception();
    }
  }
  f.wait = Wait::kDone;
  switch_context(f.context, L.scheduler, /*ends=*/true);
  __builtin_unreachable();
}

// Parks the running fiber at barrier `w` and returns when the scheduler releases it.
[[gnu::noinline]] inline void arrive(Wait w) {
  Launch& L = launch_state();
  Fiber& f = *L.current;
  f.wait = w;
  switch_context(f.context, L.scheduler);
}

// Built with AddressSanitizer, a block's arena is poisoned past the shared memory the block has
// (its dynamic shared memory, then each static declaration as it is reached): an access past it is
// then ASan's error in the kernel, as compute-sanitizer's memcheck reports one on a GPU, even where
// it stays inside the device's per-block limit.  Elsewhere these do nothing.
inline void hide(const void* p, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
  __asan_poison_memory_region(p, bytes);
#else
  (void)p, (void)bytes;
#endif
}
inline void expose(const void* p, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(p, bytes);
#else
  (void)p, (void)bytes;
#endif
}

// Gives the block bytes [filled, to) of its arena, filled with 0xFF: a NaN in every floating type
// lltm uses, so a read of shared memory nobody wrote shows in a result.
inline void fill_nan(BlockState& b, size_t to) {
  if (to > b.filled) {
    expose(b.shared + b.filled, to - b.filled);
    std::memset(b.shared + b.filled, 0xFF, to - b.filled);
    b.filled = to;
  }
}

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

inline std::string shared_over_limit(const Launch& L, size_t bytes) {
  std::ostringstream out;
  out << "lltm-cuda (emulated): kernel " << L.name << " needs " << bytes
      << " bytes of shared memory a block, over the device's limit of " << L.shared_limit
      << " (LLTM_CUDA_EMULATE_SHARED_PER_BLOCK)";
  return out.str();
}

// A `__shared__ T name[count]` declaration: the same offset in every thread of the block (each
// runs the same declarations in the same order), after the dynamic shared memory.
inline void* static_shared(size_t bytes, size_t alignment) {
  Launch& L = launch_state();
  Fiber& f = *L.current;
  const size_t start = align_up(align_up(L.dynamic_bytes, 16) + f.static_cursor, alignment);
  STD_TORCH_CHECK(start + bytes <= L.shared_limit, shared_over_limit(L, start + bytes));
  f.static_cursor = start + bytes - align_up(L.dynamic_bytes, 16);
  BlockState& b = L.blocks[f.block];
  fill_nan(b, start + bytes);
  return b.shared + start;
}

inline void* dynamic_shared() { return launch_state().blocks[launch_state().current->block].shared; }

// The address `p` (in the calling block's shared memory) has in block `rank` of the cluster.
inline void* map_shared_rank(const void* p, unsigned rank) {
  Launch& L = launch_state();
  const auto* own = L.blocks[L.current->block].shared;
  const auto* byte = static_cast<const unsigned char*>(p);
  STD_TORCH_CHECK(byte >= own && byte < own + L.shared_limit, "lltm-cuda (emulated): kernel ", L.name,
                  ": map_shared_rank of an address outside the block's shared memory");
  STD_TORCH_CHECK(rank < L.cluster, "lltm-cuda (emulated): kernel ", L.name, ": map_shared_rank to rank ", rank,
                  " of a cluster of ", L.cluster);
  const unsigned first = unsigned(L.current->block) / L.cluster * L.cluster;  // the cluster's rank 0
  return L.blocks[first + rank].shared + (byte - own);
}

inline unsigned cluster_rank() { return unsigned(launch_state().current->block) % launch_state().cluster; }
inline unsigned cluster_blocks() { return launch_state().cluster; }

// A warp-wide exchange through the scratchpad: each lane posts `value`, all lanes of the warp meet,
// each reads what read(slots) gives, and all meet again before a slot can be overwritten.
template <typename Read>
uint64_t warp_exchange(uint64_t value, Read&& read) {
  Launch& L = launch_state();
  Fiber& f = *L.current;
  BlockState& b = L.blocks[f.block];
  b.scratch[f.thread] = value;
  arrive(Wait::kWarp);
  const unsigned first = f.thread / kWarpSize * kWarpSize;
  const unsigned lanes = std::min<unsigned>(kWarpSize, L.threads - first);
  const uint64_t result = read(b.scratch.data() + first, lanes, f.thread - first);
  arrive(Wait::kWarp);
  return result;
}

// What the threads of a scope wait at: the message of a barrier that cannot complete.
inline std::string stuck(const Launch& L) {
  std::ostringstream out;
  out << "lltm-cuda (emulated): kernel " << L.name
      << ": a barrier that not every thread of its block, cluster or grid reaches (on a GPU, a hang or undefined "
         "behaviour):";
  for (unsigned b = 0; b < L.live; ++b) {
    const Fiber& first = L.fibers[b * L.threads];
    out << " block " << first.block_index.x << ":";
    Wait last = Wait::kNone;
    for (unsigned t = 0; t < L.threads; ++t) {
      const Wait w = L.fibers[b * L.threads + t].wait;
      if (t == 0 || w != last) {
        out << (t ? "," : "") << " thread " << t << "+ " << describe(w);
        last = w;
      }
    }
    out << ";";
  }
  return out.str();
}

// Which waiting fibers a barrier releases now: all of a warp at a warp barrier, all of a block at
// __syncthreads, all of a cluster at the cluster barrier, all of a cooperative grid at its barrier.
inline void release(Launch& L, std::vector<Fiber*>& ready) {
  const unsigned warps = (L.threads + kWarpSize - 1) / kWarpSize;
  const auto all_wait = [&](const Fiber* first, size_t count, Wait w) {
    return std::all_of(first, first + count, [w](const Fiber& f) { return f.wait == w; });
  };
  const auto release_all = [&](Fiber* first, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      ready.push_back(first + i);
    }
  };
  for (unsigned c = 0; c < L.live; c += L.cluster) {
    Fiber* cluster = &L.fibers[size_t(c) * L.threads];
    if (all_wait(cluster, size_t(L.cluster) * L.threads, Wait::kCluster)) {
      release_all(cluster, size_t(L.cluster) * L.threads);
    }
  }
  for (unsigned b = 0; b < L.live; ++b) {
    Fiber* block = &L.fibers[size_t(b) * L.threads];
    if (all_wait(block, L.threads, Wait::kBlock)) {
      release_all(block, L.threads);
    }
    for (unsigned w = 0; w < warps; ++w) {
      const unsigned first = w * kWarpSize, lanes = std::min(L.threads, first + kWarpSize) - first;
      if (all_wait(block + first, lanes, Wait::kWarp)) {
        release_all(block + first, lanes);
      }
    }
  }
  if (all_wait(L.fibers.data(), L.fibers.size(), Wait::kGrid)) {
    release_all(L.fibers.data(), L.fibers.size());
  }
}

// The grid barrier: only a cooperative launch has all its blocks resident at once (on a GPU, a
// grid.sync() elsewhere is undefined behaviour).
inline void grid_sync() {
  Launch& L = launch_state();
  STD_TORCH_CHECK(L.cooperative, "lltm-cuda (emulated): kernel ", L.name,
                  " waits at the grid barrier, but it was not launched cooperatively");
  arrive(Wait::kGrid);
}

enum class Order { kForward, kReverse, kShuffle };

// Runs the blocks live together (fibers set up by the caller) until every thread exits; ready
// fibers resume in `order` after every barrier.
inline void run_live(Launch& L, Order order, std::mt19937_64& rng) {
  std::vector<Fiber*> ready;
  for (Fiber& f : L.fibers) {
    ready.push_back(&f);
  }
  while (!ready.empty()) {
    if (order == Order::kReverse) {
      std::reverse(ready.begin(), ready.end());
    } else if (order == Order::kShuffle) {
      std::shuffle(ready.begin(), ready.end(), rng);
    }
    for (Fiber* f : ready) {
      f->wait = Wait::kNone;
      L.current = f;
      blockIdx = f->block_index;
      threadIdx = dim3{f->thread, 0, 0};
      switch_context(L.scheduler, f->context);
      if (L.error) {
        std::rethrow_exception(L.error);
      }
    }
    ready.clear();
    release(L, ready);
    if (ready.empty()) {
      const bool all_done = std::all_of(L.fibers.begin(), L.fibers.end(), [](const Fiber& f) { return f.wait == Wait::kDone; });
      STD_TORCH_CHECK(all_done, stuck(L));
    }
  }
}

// The whole grid: clusters one after another (in `order`), each cluster's threads together; or,
// for a cooperative launch, every block's threads together.
template <typename Body>
void run_grid(const char* name, Body& body, unsigned blocks, unsigned threads, unsigned cluster, bool cooperative,
              size_t dynamic_bytes, size_t shared_limit, Order order, uint64_t seed) {
  STD_TORCH_CHECK(blocks % cluster == 0, "lltm-cuda (emulated): kernel ", name, ": ", blocks,
                  " blocks are not a whole number of clusters of ", cluster);
  STD_TORCH_CHECK(align_up(dynamic_bytes, 16) <= shared_limit, "lltm-cuda (emulated): kernel ", name, " asks for ",
                  dynamic_bytes, " bytes of dynamic shared memory a block, over the device's limit of ", shared_limit,
                  " (LLTM_CUDA_EMULATE_SHARED_PER_BLOCK)");
  Launch L;
  L.name = name;
  L.body = [](void* c) { (*static_cast<Body*>(c))(); };
  L.closure = &body;
  L.threads = threads;
  L.cluster = cluster;
  L.live = cooperative ? blocks : cluster;
  L.cooperative = cooperative;
  L.dynamic_bytes = dynamic_bytes;
  L.shared_limit = shared_limit;
  const unsigned live = L.live;
  L.fibers.resize(size_t(live) * threads);
  L.blocks.resize(live);
  Pool& p = pool();
  while (p.stacks.size() < L.fibers.size()) {
    p.stacks.push_back(std::make_unique<Stack>());
  }
  while (p.arenas.size() < live) {
    p.arenas.emplace_back();
  }
  for (unsigned b = 0; b < live; ++b) {
    // 128-byte aligned, as the real build declares it (a tensor-core tile needs 32)
    p.arenas[b].resize(std::max(p.arenas[b].size(), shared_limit + 128));
    L.blocks[b].shared = p.arenas[b].data() + (128 - reinterpret_cast<std::uintptr_t>(p.arenas[b].data()) % 128) % 128;
    L.blocks[b].scratch.assign(threads, 0);
  }
  std::vector<unsigned> group_order(blocks / live);  // the groups of blocks live together
  std::iota(group_order.begin(), group_order.end(), 0u);
  std::mt19937_64 rng(seed);
  if (order == Order::kReverse) {
    std::reverse(group_order.begin(), group_order.end());
  } else if (order == Order::kShuffle) {
    std::shuffle(group_order.begin(), group_order.end(), rng);
  }
  Launch* const outer = current_launch;
  current_launch = &L;
  gridDim = dim3{blocks, 1, 1};
  blockDim = dim3{threads, 1, 1};
  const auto expose_arenas = [&] {  // between launches the arenas are plain memory (resize copies them)
    for (unsigned b = 0; b < live; ++b) {
      expose(p.arenas[b].data(), p.arenas[b].size());
    }
  };
  try {
    for (const unsigned c : group_order) {
      for (unsigned b = 0; b < live; ++b) {
        hide(p.arenas[b].data(), p.arenas[b].size());
        L.blocks[b].filled = 0;
        fill_nan(L.blocks[b], dynamic_bytes);
        for (unsigned t = 0; t < threads; ++t) {
          Fiber& f = L.fibers[b * threads + t];
          f = Fiber{};
          f.block = int(b);
          f.thread = t;
          f.block_index = dim3{c * live + b, 0, 0};
          make_context(f.context, p.stacks[b * threads + t]->top(), &fiber_main, &f);
        }
      }
      run_live(L, order, rng);
    }
  } catch (...) {
    expose_arenas();
    current_launch = outer;
    throw;
  }
  expose_arenas();
  current_launch = outer;
}

}  // namespace lltm_cuda::rt::emu
