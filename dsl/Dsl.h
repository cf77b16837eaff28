// The megamoe kernel DSL: C++ that builds megamoe IR. Kernel authors write typed handles and lambdas; they never
// write MLIR text or assembly. Names follow execution scope and memory level:
//   Threads     the threads that execute an op together, named at the call: the block (k.block().sync(),
//               block.mma(...)) or a warp-specialised group (the view Kernel::group hands its body: wg.mma(...))
//   Kernel      ops of the calling thread alone (signals, waits, mbarrier arrivals, TMA issue) and control flow
//   Global / Shared pointers and tiles carry their memory level in the type; shared tiles their layout too.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/abi/KernelAbi.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/IR/Value.h"

namespace megamoe::dsl {

class Kernel;

enum class Elem { bf16, f16, f32, i32, i64, e4m3 };  // e4m3: FP8 OCP E4M3FN (1 byte)
enum class Scope { cta, gpu, system };
// Whether a tile copy completes before the next op (sync) or is only issued (async: cp.async on sm_90a).
enum class Copy { sync, async };

// Scalar handles. Arithmetic builds arith ops at the kernel's insertion point.
class Bool {
 public:
  Bool(Kernel* k, mlir::Value v) : k_(k), v_(v) {}
  mlir::Value value() const { return v_; }
  Bool operator&&(const Bool& o) const;
  Bool operator||(const Bool& o) const;
  Bool operator!() const;
 private:
  Kernel* k_;
  mlir::Value v_;
};

template <int Bits>
class Int {
 public:
  Int(Kernel* k, mlir::Value v) : k_(k), v_(v) {}
  mlir::Value value() const { return v_; }
  Kernel* kernel() const { return k_; }
  Int operator+(const Int& o) const;
  Int operator-(const Int& o) const;
  Int operator*(const Int& o) const;
  Int operator/(const Int& o) const;  // unsigned
  Int operator%(const Int& o) const;  // unsigned
  Int operator+(int64_t c) const;
  Int operator-(int64_t c) const;
  Int operator*(int64_t c) const;
  Int operator/(int64_t c) const;
  Int operator%(int64_t c) const;
  Bool operator<(const Int& o) const;   // unsigned
  Bool operator>=(const Int& o) const;  // unsigned
  Bool operator==(const Int& o) const;
  Bool operator<(int64_t c) const;
  Bool operator==(int64_t c) const;
 private:
  Kernel* k_;
  mlir::Value v_;
};
using I32 = Int<32>;
using I64 = Int<64>;

// A vector of `n` values of one element type in registers (f32 for math, bf16 for storage, i32 / i64 for indices
// moved as one access).
class Vec {
 public:
  Vec(Kernel* k, mlir::Value v) : k_(k), v_(v) {}
  mlir::Value value() const { return v_; }
  Vec toF32() const;
  Vec to(Elem e) const;
  Vec operator+(const Vec& o) const;
  Vec operator*(const Vec& o) const;
  Vec operator/(const Vec& o) const;
  Vec operator-() const;
  Vec exp2() const;
  Vec min(float c) const;
  Vec max(float c) const;
  Vec splat(float c) const;  // a vector like this one filled with c
  Vec stepLE(float c) const;  // 1 where the element is <= c, else 0 (masks, e.g. the gradient of a clamp)
  Vec sum() const;            // the elements added in order, as a 1-element vector
  Vec max(const Vec& o) const;  // elementwise; an unordered pair (a NaN) keeps this vector's element
  Vec abs() const;              // |x| (as max(x, -x))
  Vec maxAll() const;           // the largest element (a tree of max), as a 1-element vector
  Vec repeat(int n) const;      // a 1-element vector's value n times
  Vec quotient(const Vec& o) const;  // IEEE-rounded division (operator/ is the approximate one)
  Vec toE4m3() const;  // f32 -> FP8 e4m3 codes (i8; nearest, ties to even, saturating at +-448; megamoe.pack_e4m3)
  Vec slice(int first, int n) const;             // elements [first, first + n)
  Vec with(int first, const Vec& part) const;    // this vector with elements [first, ...) replaced by part's
  I64 laneI64(int lane) const;                   // element `lane` of an i64 vector (std::invalid_argument otherwise)
 private:
  Kernel* k_;
  mlir::Value v_;
};

// Pointers by memory level; offsets are in elements.
class GlobalPtr {
 public:
  GlobalPtr(Kernel* k, mlir::Value v, Elem e) : k_(k), v_(v), elem_(e) {}
  mlir::Value value() const { return v_; }
  Elem elem() const { return elem_; }
  GlobalPtr operator+(const I64& elements) const;
  GlobalPtr as(Elem e) const { return {k_, v_, e}; }
  I64 address() const;  // the device address, e.g. to test whether a vector access is aligned
  Vec load(int n) const;            // n contiguous elements, one vector access
  void store(const Vec& v) const;
  I64 loadI64() const;
  I32 loadI32() const;
  void storeI32(const I32& v) const;
  void storeI64(const I64& v) const;
  // One element loaded and repeated n times (e.g. a per-row weight for a vector of that row's values).
  Vec loadSplat(int n) const;
  // Atomic fetch-and-add on an i32 (relaxed; with acqRel an acquire-release at system scope); returns the
  // previous value.
  I32 atomicAddI32(const I32& v, bool acqRel = false) const;
 private:
  Kernel* k_;
  mlir::Value v_;
  Elem elem_;
};

// How a shared tile's elements are placed: the layout its copies write and its MMA reads, fixed when the tile is
// allocated (copies, TMA loads and MMA operands read it from the tile; a mismatch is a std::logic_error at build
// time naming the tile and both layouts).
//   rowMajor     row r at r * pitch, unswizzled (staging tiles, tables)
//   k128B        K-major: rows of 128 bytes (64 bf16 of K), 16-byte chunk c of row r at chunk c ^ (r % 8) (the
//                128-byte swizzle of TMA and wgmma; the dialect's b128)
//   mn128B       MN-major (the tile's rows are K): 1024-byte atoms of 8 K rows x 64 MN elements, each row swizzled as
//                k128B, the atoms of one K group side by side (what copyTile writes; the dialect's b128_mn)
//   mn128BBoxes  MN-major as TMA boxes of 64 MN x K land: each MN atom's K groups together, the MN atoms outermost
//                (sm_90a only; mma_tile's mn_atoms_outer)
enum class Layout { rowMajor, k128B, mn128B, mn128BBoxes };
const char* layoutName(Layout layout);

// A rows x cols tile in shared memory (static or dynamic allocation), with a name for the builder's messages and
// its Layout. Views (stage, rowSlice, ...) keep both.
class SharedTile {
 public:
  SharedTile(Kernel* k, mlir::Value base, std::string name, Elem e, int64_t rows, int64_t cols, int64_t stages = 1,
             int64_t pitch = 0, Layout layout = Layout::rowMajor)
      : k_(k), base_(base), name_(std::move(name)), elem_(e), rows_(rows), cols_(cols), stages_(stages),
        pitch_(pitch ? pitch : cols), layout_(layout) {}
  const std::string& name() const { return name_; }
  Layout layout() const { return layout_; }
  bool swizzled() const { return layout_ != Layout::rowMajor; }
  int64_t stages() const { return stages_; }
  int64_t pitch() const { return pitch_; }  // elements from one row to the next (>= cols: padding avoids bank conflicts)
  int64_t bytes() const;                 // one stage
  SharedTile stage(const I32& s) const;  // stage s of a multi-stage buffer
  // Rows [first, first + count) of the first stage as a tile of its own (swizzled tiles: at a multiple of 1024
  // bytes, where the swizzle pattern starts again; std::invalid_argument otherwise).
  SharedTile rowSlice(int64_t first, int64_t count) const;
  // This tile seen as rows [firstRow, firstRow + rows()) of a taller one (its base moved back by firstRow rows), for
  // accumulator stores that place rows by the block's warpgroup index (warpgroup g writes rows 64g ..). rowMajor
  // tiles only.
  SharedTile asRowsOf(int64_t firstRow) const;
  // Columns [first, first + count) of the first stage, same pitch (e.g. one half of a staging tile; rowMajor only).
  SharedTile colSlice(int64_t first, int64_t count) const;
  // n contiguous elements of row `row` from column `col` (one vector access; col * element size 16-byte aligned).
  // The address ignores the layout: on a swizzled tile only for data the swizzle does not move (e.g. whole rows
  // of zeros).
  Vec load(const I32& row, const I32& col, int n) const;
  void store(const I32& row, const I32& col, const Vec& v) const;
  // Element access for small shared tables (row-major index into the first stage).
  I32 loadI32(const I32& index) const;
  void storeI32(const I32& index, const I32& v) const;
  // The same entry in CTA `cta` of this block's cluster (sm_90a): seen there after a Kernel::clusterSync that both
  // CTAs pass after the store.
  void storePeerI32(const I32& index, const I32& v, const I32& cta) const;
  // Atomic add (relaxed; the shared table is block-local); returns the previous value.
  I32 atomicAddI32(const I32& index, const I32& v) const;
  mlir::Value value() const { return base_; }
  Elem elem() const { return elem_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
 private:
  SharedTile view(mlir::Value base, int64_t rows, int64_t cols) const;
  Kernel* k_;
  mlir::Value base_;
  std::string name_;
  Elem elem_;
  int64_t rows_, cols_, stages_, pitch_;
  Layout layout_;
};

// An MMA accumulator fragment (m x n tile spread over the block in the target's atom layout).
struct Acc {
  mlir::Value value;
  int64_t m, n;
};

// A CUtensorMap kernel argument (sm_90a TMA): 128 bytes passed by value; the host encodes it
// (cuTensorMapEncodeTiled, in the box the argument declares) and passes its address in the launch's parameter array
// like any other argument. `box` is the declared box for the kernel's constants: every tmaLoad through the map
// copies exactly that box.
class TensorMap {
 public:
  TensorMap(mlir::Value v, const abi::TensorMapBox& box) : v_(v), box_(box) {}
  mlir::Value value() const { return v_; }
  const abi::TensorMapBox& box() const { return box_; }
 private:
  mlir::Value v_;
  abi::TensorMapBox box_;
};

// The threads that execute a tile copy, an MMA tile, an accumulator store or a barrier together, named at the
// call: the whole block (Kernel::block()) or a warp-specialised group of its threads (the view Kernel::group hands
// its body). Their ops use these threads and this barrier; no op reads an implicit current scope. The block's view
// is refused inside a group's body (its ops would run on the group's threads alone).
class Threads {
 public:
  int64_t first() const { return first_; }  // the first thread of the block in the view
  int64_t count() const { return count_; }
  int barrier() const { return barrier_; }  // 0: the block's own barrier; 1..15: the group's named barrier

  // Every thread of the view waits for the others (the block's barrier, or the group's named barrier).
  void sync() const;
  // Loads a global tile into `dst` in dst's layout (rowMajor, k128B, or mn128B for a K x MN tile: rows = K);
  // Copy::async only issues it (see Kernel::asyncCommit / asyncWait). Rows past rowsValid are zero-filled either
  // way. mn128BBoxes is TMA's placement (Kernel::tmaLoad): std::logic_error.
  void copyTile(const GlobalPtr& src, const I32& srcLd, const SharedTile& dst, const I32& rowsValid,
                Copy mode = Copy::sync) const;
  // copyTile (a load into a rowMajor or k128B tile) whose tile row r is global row rowIndex[r] of src (rowIndex: a
  // shared i32 table, one entry per row of dst; entries of rows past rowsValid are not used).
  void copyTileGather(const GlobalPtr& src, const I32& srcLd, const SharedTile& rowIndex, const SharedTile& dst,
                      const I32& rowsValid, Copy mode = Copy::sync) const;
  // Stores a rowMajor or k128B shared tile (std::logic_error for the MN-major layouts).
  void copyTile(const SharedTile& src, const GlobalPtr& dst, const I32& dstLd, const I32& rowsValid) const;
  // MMA tiles and accumulator stores need a view of whole warpgroups from thread 0 of a warpgroup: warpgroup g of
  // the block holds rows 64g .. of the tile (a group of warpgroup 1 alone computes rows 64 .. 127 with m = 64).
  Acc zeroAcc(int64_t m, int64_t n) const;
  // acc += a * b^T over a 64-wide K stage, each operand read in its tile's layout: k128B ([MN][K]), mn128B or
  // mn128BBoxes ([K][MN]; both MN-major operands in the same one). A rowMajor operand, or two MN-major ones in
  // different placements, is a std::logic_error naming the tiles and layouts. pending = 1 returns with this MMA
  // possibly still running (the previous one finished); read the accumulator only after Kernel::drain().
  // aFirstRows: every warpgroup reads A's rows [0, 64) (a 64-row tile whose columns the warpgroups split, each
  // passing its own part of B), not rows 64g ... k16 (sm_90a): only the stage's 16-wide K slice k16 (run time, 0..3).
  Acc mma(const Acc& acc, const SharedTile& a, const SharedTile& b, int64_t pending = 0, bool aFirstRows = false,
          const std::optional<I32>& k16 = std::nullopt) const;
  void storeAcc(const Acc& acc, const GlobalPtr& dst, const I32& ld, const I32& rowsValid) const;
  // mma into the registers of `registers`, whose values are not read: a * b alone, the first MMA of a chain from
  // zero without zero-filling the registers first (FP8's per-stage partial products).
  Acc mmaFresh(const Acc& registers, const SharedTile& a, const SharedTile& b, int64_t pending = 0) const;
  // FP8 block-scale promotion, in two parts so that the scales' loads can be issued a K step ahead of the MMA they
  // scale. rowScales: the scales of the `rows` distinct rows of this thread's part of an accumulator like `like`
  // (the target atom's count: GroupedGemmSpec::Tiles::scaleRows), rowScales[row * ld] * factors[f][0] (rowScales:
  // A's f32 scales of the K block's rows; each factor a 1-element f32 vector, B's scale of the block), factor by
  // factor; rows at or past rowsValid get 0. scaleAdd: acc + partial * those scales in f32 (partial: one K block's
  // product); with several factors the accumulator's columns split into as many equal groups, group f scaled with
  // factor f (a tile whose column halves come from two B blocks, e.g. SwiGLU's gate | up).
  Vec rowScales(const Acc& like, int64_t rows, const GlobalPtr& rowScales, const I32& ld, const I32& rowsValid,
                const std::vector<Vec>& factors) const;
  Acc scaleAdd(const Acc& acc, const Acc& partial, const Vec& scales) const;
  // Stages the accumulator in shared memory (all rows; a rowMajor tile), e.g. for coalesced 16-byte stores with
  // copyTile afterwards; or in TMA's boxes (an mn128BBoxes bf16 tile of the accumulator's columns and 64 rows per
  // warpgroup, each warpgroup's rows at the tile's rows r % rows()) for tmaStores of its 64-column atoms.
  void storeAcc(const Acc& acc, const SharedTile& dst) const;

 private:
  friend class Kernel;
  Threads(Kernel* k, int64_t first, int64_t count, int barrier)
      : k_(k), first_(first), count_(count), barrier_(barrier) {}
  Kernel* k_;
  int64_t first_, count_;
  int barrier_;
};

// Device context (compiler/abi/DeviceAbi.h DeviceContext): fields loaded on use.
class Context {
 public:
  Context(Kernel* k, mlir::Value p) : k_(k), p_(p) {}
  I32 rank() const;
  I32 nranks() const;
  I64 timeoutNs() const;
  GlobalPtr error() const;          // the DeviceError record
  GlobalPtr peerOffsets() const;    // the i64 peer-offset table
  I64 epoch() const;
  GlobalPtr epochSlot() const;      // where the epoch lives (only epoch_advance writes it)
  mlir::Value value() const { return p_; }
 private:
  Kernel* k_;
  mlir::Value p_;
};

// Builds one kernel: a gpu.module holding one llvm.func marked megamoe.kernel with a fixed block size. Its arguments
// are the ones its declaration (compiler/abi/KernelAbi.h) lists, declared in order by the constructor; the builder
// reads them by name, asking for the kind and element type it expects (a mismatch with the declaration throws
// std::invalid_argument). The declaration's signature hash goes into the function (megamoe.signature) and from there
// into the cache entry, where the runtime checks it.
class Kernel {
 public:
  // `tensorMaps`: the build passes the declaration's tensor-map arguments as CUtensorMaps (sm_90a TMA builds);
  // otherwise they are unused pointers.
  Kernel(mlir::MLIRContext& ctx, const abi::KernelDecl& decl, int64_t blockThreads, bool tensorMaps = false);
  // The declared kernel of that name (std::invalid_argument when none is).
  Kernel(mlir::MLIRContext& ctx, std::string_view name, int64_t blockThreads, bool tensorMaps = false);
  ~Kernel();
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const std::string& name() const { return name_; }
  int64_t blockThreads() const { return blockThreads_; }

  // Arguments by their declared names.
  GlobalPtr ptr(std::string_view name, Elem e);
  I32 i32Arg(std::string_view name);
  I64 i64Arg(std::string_view name);
  Context context();  // "ctx"
  // The map where the build passes CUtensorMaps, else nothing (the argument is an unused pointer); its box is the
  // one the declaration gives for the kernel's constants `spec` (abi::tensorMapBox).
  std::optional<TensorMap> tensorMap(std::string_view name, const abi::SpecConstants& spec);

  // Constants and ids.
  I32 i32(int64_t v);
  I64 i64(int64_t v);
  I64 widen(const I32& v);        // zero-extends
  I64 widenSigned(const I32& v);  // sign-extends
  I32 narrow(const I64& v);       // the low 32 bits
  // A vector of these i32 values, e.g. stored together as one access.
  Vec vec(const std::vector<I32>& values);
  I32 threadIdx();
  I32 blockIdx(int dim = 0);
  Vec zeros(int n, Elem e);

  // Structured control flow.
  void forRange(const I32& lo, const I32& hi, const I32& step, const std::function<void(I32)>& body);
  // A loop that carries an MMA accumulator from one iteration to the next.
  Acc forRange(const I32& lo, const I32& hi, const I32& step, const Acc& init, const std::function<Acc(I32, Acc)>& body);
  // A loop that carries a register vector (e.g. running sums) from one iteration to the next.
  Vec forRange(const I32& lo, const I32& hi, const I32& step, const Vec& init,
               const std::function<Vec(I32, Vec)>& body);
  // A loop carrying 32-bit scalars (counters, running sums) from one iteration to the next.
  std::vector<I32> forRange(const I32& lo, const I32& hi, const I32& step, const std::vector<I32>& init,
                            const std::function<std::vector<I32>(I32, const std::vector<I32>&)>& body);
  // An MMA accumulator and 32-bit scalars together (e.g. a ring slot computed one step ahead).
  std::pair<Acc, std::vector<I32>> forRange(
      const I32& lo, const I32& hi, const I32& step, const Acc& init, const std::vector<I32>& scalars,
      const std::function<std::pair<Acc, std::vector<I32>>(I32, Acc, const std::vector<I32>&)>& body);
  // Accumulators, register vectors and 32-bit scalars together (e.g. an FP8 K loop's running sum, its two partial
  // products in turn and their scales).
  struct Carried {
    std::vector<Acc> accs;
    std::vector<Vec> vecs;
    std::vector<I32> scalars;
  };
  Carried forRange(const I32& lo, const I32& hi, const I32& step, const Carried& init,
                   const std::function<Carried(I32, const Carried&)>& body);
  // A loop that runs while cond(values) holds, carrying 32-bit scalars (e.g. a ticket drawn at run time).
  std::vector<I32> whileLoop(const std::vector<I32>& init, const std::function<Bool(const std::vector<I32>&)>& cond,
                             const std::function<std::vector<I32>(const std::vector<I32>&)>& body);
  void ifThen(const Bool& cond, const std::function<void()>& body);
  // then() where cond holds, else `otherwise` (e.g. an atomic only one thread performs; its result used later).
  I32 ifElse(const Bool& cond, const std::function<I32()>& then, const I32& otherwise);
  I32 select(const Bool& cond, const I32& a, const I32& b);
  Vec select(const Bool& cond, const Vec& a, const Vec& b);
  void returnIf(const Bool& cond);  // every thread for which cond holds exits the kernel

  // Shared memory: static tiles (small), or dynamic multi-stage buffers (any size the target holds; the kernel's
  // dynamic shared bytes are recorded for the launch).
  // `name` names the tile in the builder's messages; `layout` is the one its copies write and its MMA reads.
  // Swizzled layouts need 1024-byte alignment, no padding, stages of whole 1024-byte swizzle atoms and rows of
  // 128 bytes (k128B) or a multiple of 128 (mn128B, mn128BBoxes) (std::invalid_argument otherwise).
  SharedTile sharedTile(std::string name, Elem e, int64_t rows, int64_t cols, Layout layout = Layout::rowMajor);
  // `align`: 1024 (swizzled MMA operands need it) or at least 16 for small tables.
  SharedTile dynamicSharedTile(std::string name, Elem e, int64_t rows, int64_t cols, int64_t stages,
                               Layout layout = Layout::rowMajor, int64_t pitch = 0, int64_t align = 1024);

  // Every thread of the block, as the threads of block-scope ops (copies, MMA tiles, accumulator stores, sync);
  // outside groups only (std::logic_error inside one).
  Threads block();
  // Warp specialisation (sm_90a): `body` runs on threads [first, first + threads) of the block only (whole warps),
  // and gets them as a view: its copies, MMA tiles and accumulator stores use those threads, its sync() is the
  // group's own named barrier `barrier` (1..15; groups that run at the same time need distinct ids). Groups do not
  // nest.
  void group(int64_t first, int64_t threads, int barrier, const std::function<void(const Threads&)>& body);
  // Named barrier `id` (1..15) of `threads` threads across groups: the calling group's threads wait there (sync)
  // or only count themselves in (arrive), e.g. one group hands a shared tile over to another.
  void namedBarrier(int id, int64_t threads, bool arriveOnly);
  // n 8-byte mbarriers in dynamic shared memory (a producer and its consumers hand ring slots over with them).
  SharedTile mbarriers(int64_t n);
  // One thread initialises barrier i for `count` arrivals per phase (a block().sync() must follow).
  void mbarrierInit(const SharedTile& bars, const I32& i, int64_t count);
  void mbarrierArrive(const SharedTile& bars, const I32& i);  // the calling thread: one arrival (release)
  // The calling thread waits until barrier i's phase of parity `parity` (0 / 1) has completed (acquire).
  // clusterAcquire: the phase was completed by another CTA's cluster-scope release (mbarrierArrivePeer).
  void mbarrierWait(const SharedTile& bars, const I32& i, const I32& parity, bool clusterAcquire = false);
  // The calling thread: one arrival on barrier i once its async copies issued so far have landed.
  void asyncArrive(const SharedTile& bars, const I32& i);
  // The calling thread: one arrival on barrier i that also expects `bytes` from tmaLoads completing on it.
  void mbarrierArriveExpectTx(const SharedTile& bars, const I32& i, int64_t bytes);
  // The calling thread: starts copying the box of `map` at `coords` (innermost first) into `dst`, completing on
  // barrier i (sm_90a TMA; elements outside the tensor arrive as zeros). `dst` holds exactly the map's declared box
  // (its element type and bytes) in the layout the box's swizzle writes (sw128: k128B, or mn128BBoxes for K x MN
  // tiles); std::logic_error otherwise, naming the tile and both layouts.
  // A non-zero `multicast` mask writes the box into those CTAs of the cluster (same offsets, their barrier i).
  void tmaLoad(const TensorMap& map, const std::vector<I32>& coords, const SharedTile& dst, const SharedTile& bars,
               const I32& i, int64_t multicast = 0);
  // The calling thread: starts copying `src` (exactly the map's declared box, in the layout tmaLoad writes) to the
  // map's tensor at `coords` (innermost first; elements outside it are not written), in its bulk-store group
  // (bulkCommit / bulkWait, as bulkStore). Rows other threads wrote reach it through storeAcc and a barrier.
  void tmaStore(const TensorMap& map, const std::vector<I32>& coords, const SharedTile& src);
  // The calling thread: one arrival on barrier i of CTA `cta` of this block's cluster.
  // clusterRelease: this thread's earlier accesses are ordered before the arrival for the other CTA too (a fence).
  void mbarrierArrivePeer(const SharedTile& bars, const I32& i, const I32& cta, bool clusterRelease = false);
  // The calling thread: copies `src` (this CTA's shared tile, 16-byte multiple) to the same offset in CTA `cta` of
  // the cluster, completing on that CTA's barrier i, which expects the bytes (mbarrierArriveExpectTx there). Shared
  // data this thread wrote into `src` needs a proxyFence first.
  void sharedCopyPeer(const SharedTile& src, const SharedTile& bars, const I32& i, const I32& cta);
  // Thread-block clusters of `x` blocks along x (sm_90a; the grid must be a multiple of x), and their meeting
  // point: every thread of every block of the cluster (barriers initialised before it are visible cluster-wide).
  void setClusterX(int64_t x);
  void clusterSync();
  // Orders shared data written by ordinary stores or async copies (seen through a barrier) before this thread's
  // next MMA tile reads it.
  // With `global`: global data (e.g. rows peers stored, seen through an acquire) before this thread's next
  // tmaLoad reads it.
  void proxyFence(bool global = false);
  // The calling thread's earlier memory accesses are ordered before its later ones for every observer (an
  // acquire-release fence at system scope), e.g. stores before a barrier that a counter update follows.
  void fence();
  // The calling warpgroup's register budget (whole warpgroups; count a multiple of 8 in [24, 256]).
  void setMaxRegisters(int64_t count, bool increase);

  // The calling thread's async tile copies (Copy::async): close a group of them; wait until at most `pending`
  // groups are in flight.
  void asyncCommit();
  void asyncWait(int64_t pending);
  // The accumulator once the MMA tiles that produce it have finished (the calling thread's fragment). pending = 1:
  // once at most the latest MMA tile is in flight, for an accumulator of an earlier one.
  Acc drain(const Acc& acc, int64_t pending = 0);

  // Block-wide ops: every thread of the block (they start with the block's barrier; std::logic_error inside a group).
  Bool gridBarrier(const Context& ctx, const GlobalPtr& counter, const I64& expected);
  Bool rankBarrier(const Context& ctx, const GlobalPtr& flags, const I64& value);

  // Thread scope: starts copying `bytes` (a multiple of 16) of row `row` of `src` (a rowMajor tile) to `dst` without
  // waiting (sm_90a: a bulk copy; gfx950: at once). Rows another thread wrote are ready for it after storeAcc and
  // a sync of the threads that stored them. Rewrite the row only after bulkWait(true); the data is at `dst` for
  // others after bulkWait(false) (then signal).
  void bulkStore(const SharedTile& src, const I32& row, const GlobalPtr& dst, int64_t bytes);
  void bulkCommit();
  void bulkWait(bool readOnly);

  // Thread-scope ops on the symmetric heap.
  GlobalPtr peer(const Context& ctx, const GlobalPtr& local, const I32& peerRank);
  void signal(const GlobalPtr& flag, const I64& value, Scope scope, bool add = false);
  Bool waitAtLeast(const Context& ctx, const GlobalPtr& flag, const I64& expected, const I64& flagId, Scope scope);
  // True while the rank's device error record is clear (an acquire load of its code word).
  Bool errorClear(const Context& ctx);
  // Claims the rank's error record (first error wins) for `code` (abi::ErrorCode) with the values it names.
  void reportError(const Context& ctx, uint64_t code, const I64& flag, const I64& seen, const I64& expected);

  // Finishes the function and hands over the module (the Kernel is spent afterwards).
  mlir::OwningOpRef<mlir::ModuleOp> finish();

  // Internal: the builder at the current insertion point.
  mlir::OpBuilder& builder() { return b_; }
  mlir::Location loc() const { return loc_; }
  mlir::Type type(Elem e);
  // The type an element has in memory (GEPs, loads, stores): type(e), but i8 for e4m3 (bytes to LLVM).
  mlir::Type storageType(Elem e);

 private:
  mlir::Value addArg(mlir::Type t, mlir::DictionaryAttr attrs = {});
  // The declared argument `name`, checked against the kind and element the builder asks for.
  mlir::Value arg(std::string_view name, abi::ArgKind kind, abi::Elem elem = abi::Elem::kNone);
  abi::KernelDecl decl_;
  bool tensorMaps_;
  std::vector<mlir::Value> args_;  // in decl_.args order
  std::string name_;
  int64_t blockThreads_;
  mlir::OpBuilder b_;
  mlir::Location loc_;
  mlir::OwningOpRef<mlir::ModuleOp> module_;
  mlir::Operation* func_ = nullptr;
  mlir::Operation* gpuModule_ = nullptr;
  int sharedCount_ = 0;
  int64_t dynamicSharedBytes_ = 0;
  bool inGroup_ = false;  // inside a group's body (groups do not nest; the block's ops are refused there)
  friend class Threads;
  // A view's op `op` where the builder is: the block's view inside a group is a std::logic_error.
  void checkView(const Threads& view, const char* op) const;
  mlir::Value mbarrierAt(const SharedTile& bars, const I32& i);
  // Loop-carried values as the DSL's 32-bit scalars.
  std::vector<I32> scalars(mlir::ValueRange values);
  // scf.for over [lo, hi) carrying `init`; body gets the induction variable and the carried values.
  std::vector<mlir::Value> loop(const I32& lo, const I32& hi, const I32& step, const std::vector<mlir::Value>& init,
                                const std::function<std::vector<mlir::Value>(I32, std::vector<mlir::Value>)>& body);
};

}  // namespace megamoe::dsl
