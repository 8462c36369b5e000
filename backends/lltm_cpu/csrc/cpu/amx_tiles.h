// The AMX tile state as lltm-cpu's AMX kernel (gemm_bf16_amx.cpp) and the
// benchmarks' peak kernel (benchmarks/machine_peak.cpp) use it: Linux's
// permission, and all eight tiles as 16 rows of 64 bytes.  Needs a compiler
// with AMX; each function carries its own target, for an includer compiled
// without -mamx-tile.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace lltm_cpu {
namespace amx_tiles {

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

constexpr int kTileRows = 16, kTileBytes = 64;

// Claims the tiles for this thread, each kTileRows x kTileBytes.
__attribute__((target("amx-tile"))) inline void configure() {
  TileConfig config;
  for (int tile = 0; tile < 8; ++tile) {
    config.bytes_per_row[tile] = kTileBytes;
    config.rows[tile] = kTileRows;
  }
  _tile_loadconfig(&config);
}

// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux lends a process
// the tile state only when asked (Linux 5.16 on); false where the kernel or
// the hypervisor does not hand out the tiles.
inline bool request_permission() {
  constexpr long kRequestPermission = 0x1023, kTileData = 18;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

}  // namespace amx_tiles
}  // namespace lltm_cpu
