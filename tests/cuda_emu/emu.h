// A CPU emulation of the part of the CUDA execution model polydev's kernels use, so their
// logic is tested on machines without a GPU: every thread of a block is a std::thread,
// __syncthreads is a block barrier, __shfl_xor_sync exchanges through a per-warp barrier,
// and __shared__ arrays are static (blocks run one after another). Exited threads drop out
// of the barriers, as exited threads do on the GPU.
#include <math.h>
#include <string.h>
#include <algorithm>
#include <barrier>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define POLYDEV_CUDA_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct dim3 { unsigned x = 1, y = 1, z = 1; };
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

using std::max;
using std::min;

inline float __int_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned v; memcpy(&v, &f, 4); return v; }
inline float f16_to_f32(unsigned short u) { _Float16 h; memcpy(&h, &u, 2); return (float) h; }
inline unsigned short f32_to_f16(float f) {
    _Float16 h = (_Float16) f;
    unsigned short u;
    memcpy(&u, &h, 2);
    return u;
}

struct EmuWarp {
    std::barrier<> bar;
    unsigned long long slots[32];
    explicit EmuWarp(int n) : bar(n) {}
};

inline std::barrier<> * emu_block_barrier;
inline std::vector<std::unique_ptr<EmuWarp>> emu_warps;

inline int emu_thread_rank() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }

template <class T> T __shfl_xor_sync(unsigned, T v, int lane_mask, int = 32) {
    int rank = emu_thread_rank(), lane = rank % 32;
    EmuWarp & w = *emu_warps[rank / 32];
    memcpy(&w.slots[lane], &v, sizeof(T));
    w.bar.arrive_and_wait();
    T r;
    memcpy(&r, &w.slots[lane ^ lane_mask], sizeof(T));
    w.bar.arrive_and_wait();
    return r;
}

template <class... A, size_t... I>
void emu_call(void (*kernel)(A...), void ** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(args[I])...);
}

// One std::thread per thread of a block, kept for the whole grid: the blocks run one after
// another, and between two blocks (when every thread has left the kernel) the completion step
// of a grid-wide barrier makes the next block's barriers and advances the block index.
template <class... A>
void emu_launch(void (*kernel)(A...), const unsigned * grid, const unsigned * block,
                void ** args) {
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    const int n = block[0] * block[1] * block[2];
    const long n_blocks = (long) grid[0] * grid[1] * grid[2];
    long next = -1;
    std::unique_ptr<std::barrier<>> block_barrier;
    auto next_block = [&]() noexcept {
        next++;
        block_barrier.reset(new std::barrier<>(n));
        emu_block_barrier = block_barrier.get();
        emu_warps.clear();
        for (int w = 0; w < n; w += 32) emu_warps.emplace_back(new EmuWarp(std::min(32, n - w)));
    };
    std::barrier<decltype(next_block)> between_blocks(n, next_block);
    std::vector<std::thread> threads;
    for (int t = 0; t < n; t++) {
        threads.emplace_back([&, t] {
            threadIdx = {t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
            for (;;) {
                between_blocks.arrive_and_wait();
                if (next >= n_blocks) return;
                blockIdx = {unsigned(next % grid[0]), unsigned(next / grid[0] % grid[1]),
                            unsigned(next / ((long) grid[0] * grid[1]))};
                emu_call(kernel, args, std::index_sequence_for<A...>{});
                emu_warps[t / 32]->bar.arrive_and_drop();
                emu_block_barrier->arrive_and_drop();
            }
        });
    }
    for (auto & th : threads) th.join();
}

#define EMU_EXPORT(name) \
    extern "C" void emu_##name(const unsigned * g, const unsigned * b, void ** a) { \
        emu_launch(name, g, b, a); \
    }
