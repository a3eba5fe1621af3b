// GlobalTensor, LocalTensor, TPipe, TQue, TBuf of the twin (namespace AscendC), with
// the rules they enforce: capacity per memory, 32-byte buffer granularity, at most 64
// buffers per pipe and 8 queue buffers per position, queue depth, and the
// AllocTensor/EnQue/DeQue/FreeTensor state machine, which must end balanced.
#ifndef FLASH_CANN_TWIN_TENSOR_H
#define FLASH_CANN_TWIN_TENSOR_H

#include <cstring>
#include <string>
#include <vector>

#include "core.h"
#include "race.h"
#include "sync.h"

namespace AscendC {

enum class TPosition : uint8_t {
    GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM = SPM,
    TSCM, C2PIPE2GM, C2PIPE2LOCAL, MAX
};
using QuePosition = TPosition;

twin::Memory PhysicalMemory(TPosition position);

template <typename T>
class LocalTensor {
public:
    LocalTensor() = default;

    // Scalar accesses run on PIPE_S.
    T GetValue(uint32_t index, TWIN_SITE) const
    {
        CheckElements(index, 1, TWIN_HERE, "GetValue");
        twin::Instruction(twin::kPipeS, TWIN_HERE, twin::Work::Scalar(false)).Read(Memory(), Data() + index, sizeof(T));
        T value;
        std::memcpy(&value, Bytes() + uint64_t{index} * sizeof(T), sizeof(T));
        return value;
    }
    template <typename S>
    void SetValue(uint32_t index, const S value, TWIN_SITE) const
    {
        CheckElements(index, 1, TWIN_HERE, "SetValue");
        twin::Instruction(twin::kPipeS, TWIN_HERE, twin::Work::Scalar(false)).Write(Memory(), Data() + index, sizeof(T));
        const T converted = static_cast<T>(value);
        std::memcpy(Bytes() + uint64_t{index} * sizeof(T), &converted, sizeof(T));
    }
    // A view starting `offset` elements in; it ends where this tensor ends.
    LocalTensor operator[](uint32_t offset) const
    {
        LocalTensor view = *this;
        const uint64_t bytes = uint64_t{offset} * sizeof(T);
        view.byteOffset_ += static_cast<uint32_t>(bytes);
        view.byteLength_ = bytes <= byteLength_ ? byteLength_ - static_cast<uint32_t>(bytes) : 0;
        return view;
    }
    uint32_t GetSize() const { return byteLength_ / sizeof(T); }
    template <typename U>
    LocalTensor<U> ReinterpretCast() const
    {
        LocalTensor<U> other;
        other.Bind(position_, base_, byteOffset_, byteLength_);
        return other;
    }
    int32_t GetPosition() const { return static_cast<int32_t>(position_); }

    // --- twin internals ---
    void Bind(TPosition position, uint8_t* base, uint32_t byteOffset, uint32_t byteLength)
    {
        position_ = position;
        base_ = base;
        byteOffset_ = byteOffset;
        byteLength_ = byteLength;
    }
    TPosition Position() const { return position_; }
    twin::Memory Memory() const { return PhysicalMemory(position_); }
    uint32_t ByteOffset() const { return byteOffset_; }
    uint8_t* Bytes() const { return base_ + byteOffset_; }
    T* Data() const { return reinterpret_cast<T*>(Bytes()); }
    // `count` elements from element `first` must lie inside this tensor.
    void CheckElements(uint64_t first, uint64_t count, const twin::Site& site, const char* what) const
    {
        twin::Require(base_ != nullptr, site, "[R14] ", what, ": the LocalTensor is not bound to a buffer");
        twin::Require((first + count) * sizeof(T) <= byteLength_, site, "[R15] ", what, ": elements [",
                      first, ", ", first + count, ") exceed the ", twin::MemoryName(Memory()),
                      " tensor of ", byteLength_ / sizeof(T), " elements");
    }

private:
    TPosition position_ = TPosition::MAX;
    uint8_t* base_ = nullptr;
    uint32_t byteOffset_ = 0;
    uint32_t byteLength_ = 0;
};

template <typename T>
class GlobalTensor {
public:
    void SetGlobalBuffer(T* buffer, uint64_t bufferSize)
    {
        data_ = buffer;
        size_ = bufferSize;
    }
    void SetGlobalBuffer(T* buffer) { SetGlobalBuffer(buffer, 0); }
    T GetValue(uint64_t offset, TWIN_SITE) const
    {
        twin::CheckGm(data_ + offset, sizeof(T), TWIN_HERE, "GlobalTensor::GetValue");
        twin::Instruction(twin::kPipeS, TWIN_HERE, twin::Work::Scalar(true)).Read(twin::Memory::GM, data_ + offset, sizeof(T));
        return data_[offset];
    }
    void SetValue(uint64_t offset, T value, TWIN_SITE)
    {
        twin::CheckGm(data_ + offset, sizeof(T), TWIN_HERE, "GlobalTensor::SetValue");
        twin::Instruction(twin::kPipeS, TWIN_HERE, twin::Work::Scalar(true)).Write(twin::Memory::GM, data_ + offset, sizeof(T));
        data_[offset] = value;
    }
    GlobalTensor operator[](uint64_t offset) const
    {
        GlobalTensor view;
        view.data_ = data_ + offset;
        view.size_ = size_ > offset ? size_ - offset : 0;
        return view;
    }
    uint64_t GetSize() const { return size_; }
    T* Data() const { return data_; }

private:
    T* data_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace AscendC

namespace twin {

// Buffer bookkeeping shared by TQue and TBuf.
class Pipe;

class QueueBase {
public:
    QueueBase() = default;
    QueueBase(const QueueBase&) = delete;
    QueueBase& operator=(const QueueBase&) = delete;
    ~QueueBase();  // a queue that ends before its pipe is checked for balance then
    enum class State { Free, Allocated, Enqueued, Dequeued };
    struct Buffer {
        uint32_t offset;
        State state = State::Free;
        Clock handedOver;  // the producer's work at EnQue, for the consumer's DeQue
        Clock freed;       // the consumer's work at FreeTensor, for the next AllocTensor
        // The ids of TPipe's event pool this buffer holds, set and not yet waited on: from
        // EnQue to DeQue, and from FreeTensor to the next AllocTensor (-1: none).
        int enqueueEventId = -1;
        int freeEventId = -1;
    };

    AscendC::TPosition position = AscendC::TPosition::MAX;
    uint32_t bytes = 0;  // per buffer
    int32_t depth = 0;
    std::vector<Buffer> buffers;
    std::vector<size_t> fifo;  // enqueued buffers, oldest first
    size_t next = 0;           // round-robin allocation
    Site initSite{"", 0};
    bool isQueue = true;
    Pipe* owner = nullptr;

    Buffer& Find(uint32_t offset, const Site& site, const char* what);
    size_t Allocate(const Site& site);
    void Enqueue(uint32_t offset, const Site& site);
    size_t Dequeue(const Site& site);
    void Release(uint32_t offset, const Site& site);
    // Waits on and gives back the pool ids the buffers still hold (TPipe::Destroy).
    void ReleaseEvents();
    uint8_t* Base() const;
};

class Pipe {
public:
    void Register(QueueBase& queue, AscendC::TPosition position, uint32_t count, uint32_t bytes,
                  int32_t depth, bool isQueue, const Site& site);
    // Record (destructors cannot throw) the first queue left unbalanced.
    void CheckBalanced();
    void Retire(QueueBase& queue);
    uint32_t Used(Memory memory) const;
    // " (the buffer initialised at file:line)" for the buffer holding `offset`, or "".
    std::string Owner(Memory memory, uint32_t offset) const;
    // TPipe's construction and destruction: the event pool is emptied; on the dav-c220
    // cube core the constructor takes M_MTE1 ids 0-2 and sets them, Destroy waits on them
    // and on the ids freed queue buffers still hold (asc-devkit kernel_tpipe_impl.h,
    // TPipe::Init, DestroyWithoutPipeAll).
    void Open(const Site& site);
    void Close();
    std::string pending;

private:
    bool open_ = false;
    std::vector<QueueBase*> queues_;
    uint32_t used_[6] = {};
    uint32_t buffers_ = 0;
};

}  // namespace twin

namespace AscendC {

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue : public twin::QueueBase {
public:
    TQue() { static_assert(pos != TPosition::VECCALC && pos != TPosition::GM, "TQue position"); }
    template <typename T>
    LocalTensor<T> AllocTensor(TWIN_SITE)
    {
        return Tensor<T>(Allocate(TWIN_HERE));
    }
    template <typename T>
    bool EnQue(const LocalTensor<T>& tensor, TWIN_SITE)
    {
        Enqueue(tensor.ByteOffset(), TWIN_HERE);
        return true;
    }
    template <typename T>
    LocalTensor<T> DeQue(TWIN_SITE)
    {
        return Tensor<T>(Dequeue(TWIN_HERE));
    }
    template <typename T>
    void FreeTensor(LocalTensor<T>& tensor, TWIN_SITE)
    {
        Release(tensor.ByteOffset(), TWIN_HERE);
    }
    bool VacantInQue() const { return static_cast<int32_t>(fifo.size()) < depth; }
    bool HasTensorInQue() const { return !fifo.empty(); }

private:
    template <typename T>
    LocalTensor<T> Tensor(size_t index) const
    {
        LocalTensor<T> tensor;
        tensor.Bind(pos, Base(), buffers[index].offset, bytes);
        return tensor;
    }
};

template <TPosition pos = TPosition::VECCALC>
class TBuf : public twin::QueueBase {
public:
    template <typename T>
    LocalTensor<T> Get(TWIN_SITE) const
    {
        return GetWithOffset<T>(bytes / sizeof(T), 0, TWIN_HERE);
    }
    template <typename T>
    LocalTensor<T> Get(uint32_t len, TWIN_SITE) const
    {
        return GetWithOffset<T>(len, 0, TWIN_HERE);
    }
    template <typename T>
    LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset, TWIN_SITE) const
    {
        twin::Require(!buffers.empty(), TWIN_HERE, "[R16] ", "TBuf::Get before TPipe::InitBuffer");
        twin::Require(bufOffset % twin::kBlockBytes == 0, TWIN_HERE, "[R17] ",
                      "TBuf::GetWithOffset: offset ", bufOffset, " is not 32-byte aligned");
        twin::Require(bufOffset + uint64_t{size} * sizeof(T) <= bytes, TWIN_HERE, "[R18] ",
                      "TBuf::Get: ", size, " elements at byte ", bufOffset,
                      " exceed the buffer of ", bytes, " bytes");
        LocalTensor<T> tensor;
        tensor.Bind(pos, Base(), buffers[0].offset + bufOffset, size * sizeof(T));
        return tensor;
    }
};

class TPipe {
public:
    TPipe(TWIN_SITE);
    ~TPipe();
    template <TPosition pos, int32_t depth, auto mask>
    bool InitBuffer(TQue<pos, depth, mask>& que, uint8_t num, uint32_t len, TWIN_SITE)
    {
        pipe_.Register(que, pos, num, len, depth, true, TWIN_HERE);
        return true;
    }
    template <TPosition pos>
    bool InitBuffer(TBuf<pos>& buf, uint32_t len, TWIN_SITE)
    {
        pipe_.Register(buf, pos, 1, len, 0, false, TWIN_HERE);
        return true;
    }
    void Destroy()
    {
        pipe_.CheckBalanced();
        pipe_.Close();
    }

    // The event-id pool (asc-devkit basic_api/kernel_tpipe.h): AllocEventID takes the
    // lowest id of `evt` that neither a queue nor the kernel holds, until ReleaseEventID;
    // FetchEventID names that id without taking it (for a SetFlag/WaitFlag pair with
    // nothing of the pool's in between).
    template <HardEvent evt>
    TEventID AllocEventID(TWIN_SITE)
    {
        return static_cast<TEventID>(twin::PoolAlloc(static_cast<int>(evt),
                                                     {twin::EventOwner::kKernel, TWIN_HERE, TWIN_HERE}, TWIN_HERE));
    }
    template <HardEvent evt>
    void ReleaseEventID(TEventID id, TWIN_SITE)
    {
        twin::PoolRelease(static_cast<int>(evt), id, true, TWIN_HERE);
    }
    template <HardEvent evt>
    TEventID FetchEventID(TWIN_SITE)
    {
        return FetchEventID(evt, TWIN_HERE);
    }
    TEventID FetchEventID(HardEvent evt, TWIN_SITE)
    {
        return static_cast<TEventID>(twin::PoolFetch(static_cast<int>(evt), TWIN_HERE));
    }

private:
    twin::Pipe pipe_;
};

}  // namespace AscendC

#endif
