// Moving a matrix into the cube's operand layouts (AIC). A matrix X of R x C elements
// (both padded to multiples of 16) sits in L1 in Nz: 16-column panels, each R x 16,
// row-major 16 x 16 fractals; fractal (r / 16, c / 16) is at ((c / 16) * R / 16 + r / 16)
// fractals. From there, one LoadData per panel or row block gives each operand form:
//   A = X     Zz (fractal row-major over (row block, col block))    LoadLeft
//   A = X^T   Zz of X^T: the same fractal order, each transposed     LoadLeftTransposed
//   B = X     Zn (fractal order (row block, col block), transposed)  LoadRight
//   B = X^T   Zn of X^T: Nz of X as it is                           LoadRightTransposed
#ifndef FLASH_CANN_FLASH_ATTENTION_FRACTAL_H
#define FLASH_CANN_FLASH_ATTENTION_FRACTAL_H

#include "kernel_operator.h"
#include "flash_cann_tiling.h"

namespace flash_cann {

// `rows` rows of `cols` elements (GM row pitch `pitch`) -> Nz in L1 with `padRows` rows
// and `padCols` columns. Rows past `rows` are zeroed first, so no stale L1 data enters a
// product; a partial last 16-column block is zero-padded by the ND->NZ copy itself.
template <typename T>
__aicore__ inline void LoadNz(const AscendC::LocalTensor<T>& l1, const AscendC::GlobalTensor<T>& src,
                              uint32_t rows, uint32_t padRows, uint32_t cols, uint32_t padCols,
                              uint64_t pitch)
{
    if (rows < padRows) {
        const uint16_t blocks = static_cast<uint16_t>(padRows * padCols * sizeof(T) / kByteBlock);
        AscendC::InitConstValue(l1, AscendC::InitConstValueParams<T>(1, blocks, 0, T(0.0f)));
        AscendC::PipeBarrier<PIPE_MTE2>();
    }
    AscendC::DataCopy(l1, src,
                      AscendC::Nd2NzParams(1, static_cast<uint16_t>(rows), static_cast<uint16_t>(cols), 0,
                                           static_cast<uint16_t>(pitch), static_cast<uint16_t>(padRows), 1, 0));
}

template <typename T>
__aicore__ inline void LoadLeft(const AscendC::LocalTensor<T>& a, const AscendC::LocalTensor<T>& l1,
                                uint32_t rows, uint32_t cols)
{
    for (uint32_t block = 0; block < rows / kCubeBlock; ++block) {
        AscendC::LoadData(a[block * kCubeBlock * cols], l1[block * kCubeBlock * kCubeBlock],
                          AscendC::LoadData2DParams(0, static_cast<uint8_t>(cols / kCubeBlock),
                                                    static_cast<uint16_t>(rows / kCubeBlock), 0, 0, false, 0));
    }
}

template <typename T>
__aicore__ inline void LoadLeftTransposed(const AscendC::LocalTensor<T>& a, const AscendC::LocalTensor<T>& l1,
                                          uint32_t rows, uint32_t cols)
{
    for (uint32_t panel = 0; panel < cols / kCubeBlock; ++panel) {
        AscendC::LoadData(a[panel * rows * kCubeBlock], l1[panel * rows * kCubeBlock],
                          AscendC::LoadData2DParams(0, static_cast<uint8_t>(rows / kCubeBlock), 1, 0, 0, true, 0));
    }
}

template <typename T>
__aicore__ inline void LoadRight(const AscendC::LocalTensor<T>& b, const AscendC::LocalTensor<T>& l1,
                                 uint32_t rows, uint32_t cols)
{
    for (uint32_t block = 0; block < rows / kCubeBlock; ++block) {
        AscendC::LoadData(b[block * kCubeBlock * cols], l1[block * kCubeBlock * kCubeBlock],
                          AscendC::LoadData2DParams(0, static_cast<uint8_t>(cols / kCubeBlock),
                                                    static_cast<uint16_t>(rows / kCubeBlock), 0, 0, true, 0));
    }
}

template <typename T>
__aicore__ inline void LoadRightTransposed(const AscendC::LocalTensor<T>& b, const AscendC::LocalTensor<T>& l1,
                                           uint32_t rows, uint32_t cols)
{
    for (uint32_t panel = 0; panel < cols / kCubeBlock; ++panel) {
        AscendC::LoadData(b[panel * rows * kCubeBlock], l1[panel * rows * kCubeBlock],
                          AscendC::LoadData2DParams(0, static_cast<uint8_t>(rows / kCubeBlock), 1, 0, 0, false, 0));
    }
}

}  // namespace flash_cann

#endif
