"""What aicfc claims to support, op by op: the one source of `aicfc ops`, `aicfc check`'s list
and the README's support table (between its `ops:begin`/`ops:end` markers; `make readme-ops`
rewrites it, a test checks it).

Every op the importer takes (the High IR op table plus the import-only ops) has one line of
notes here saying which variants work and which are refused at import with a named error; a
test keeps the two sets equal, so an op cannot be added without saying what it covers.
"""
from __future__ import annotations

NOTES: dict[str, str] = {
    "Add": "numpy broadcasting; run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "AveragePool": "1-D, 2-D, 3-D; kernel, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad",
    "BatchNormalization": "inference; folded into a preceding Conv, else a per-channel affine map",
    "Cast": "between float32, float16, float64, int64, int32 and bool",
    "Clip": "constant min/max; fused as a GEMM/conv epilogue; run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "Concat": "any axis, run-time or constant inputs: one element-wise map of guarded loads (folded on constants)",
    "Constant": "any value; folded",
    "ConstantOfShape": "folded at compile time",
    "Conv": "1-D, 2-D, 3-D implicit GEMM (tensor cores at fp16/bf16): groups, depthwise, stride, dilation, pads, "
            "auto_pad; bias and activation fused",
    "Div": "numpy broadcasting; integers (int32/int64) at run time in int64, truncated toward zero (a zero divisor gives 0)",
    "Dropout": "inference (identity); training mode refused",
    "Equal": "float, bool or int64/int32 inputs (integers compared exactly), broadcasting; a bool result (masks)",
    "Erf": "",
    "Exp": "",
    "Expand": "constant shape; a broadcast read (float, bool or integer)",
    "Flatten": "a view (float, integer or bool)",
    "Gather": "any axis, indices of any rank from a run-time int64/int32 input or a constant (embeddings); "
              "negative ids wrap, out-of-range ids are clamped",
    "Gemm": "transA, transB, alpha, beta; bias full, broadcast or absent",
    "GlobalAveragePool": "any rank >= 3; a row reduction",
    "Identity": "",
    "LRN": "",
    "LayerNormalization": "any axis; Y in one row pass; the Mean/InvStdDev outputs too (computed apart; of float32 "
                          "inputs only)",
    "Log": "",
    "MatMul": "2-D, batched, broadcast batch dimensions, 1-D operands",
    "Max": "any number of float or int64/int32 inputs (integers exact), broadcasting",
    "MaxPool": "1-D, 2-D, 3-D; kernel, strides, pads, dilations, ceil_mode; the Indices output refused",
    "Min": "any number of float or int64/int32 inputs (integers exact), broadcasting",
    "Mul": "numpy broadcasting; run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "Neg": "float; run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "Pow": "constant exponent in -4..4 or ±0.5",
    "Range": "folded at compile time",
    "Reciprocal": "",
    "ReduceMax": "one reduced axis (or several of extent 1); keepdims",
    "ReduceMean": "one reduced axis (or several of extent 1); keepdims",
    "ReduceSum": "one reduced axis (or several of extent 1); keepdims",
    "Relu": "",
    "Reshape": "constant target shape with 0 and -1 (allowzero=1 too, unless the target has a 0); a view of float, integer or bool tensors",
    "Shape": "folded at compile time (static shapes)",
    "Sigmoid": "",
    "Slice": "constant starts/ends/axes/steps, negative steps; float, bool or integer; empty results refused",
    "Softmax": "any axis; one row pass",
    "Split": "split input (opset 13) or num_outputs (opset 18); zero-size parts refused",
    "Sqrt": "",
    "Squeeze": "a view (float, integer or bool)",
    "Sub": "numpy broadcasting; run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "Sum": "any number of inputs",
    "Tanh": "",
    "Transpose": "any perm; folded into the reader's access",
    "Unsqueeze": "a view (float, integer or bool)",
    "Where": "float, bool or int64/int32 data, bool condition",
    "And": "bool inputs, broadcasting (masks)",
    "Or": "bool inputs, broadcasting (masks)",
    "Xor": "bool inputs, broadcasting (masks)",
    "Not": "bool input (masks)",
    "Greater": "float, bool or int64/int32 inputs (integers compared exactly), broadcasting; a bool result (masks)",
    "Less": "float, bool or int64/int32 inputs (integers compared exactly), broadcasting; a bool result (masks)",
    "GreaterOrEqual": "float, bool or int64/int32 inputs (integers compared exactly), broadcasting; a bool result (masks)",
    "LessOrEqual": "float, bool or int64/int32 inputs (integers compared exactly), broadcasting; a bool result (masks)",
    "IsNaN": "float input; `Where(IsNaN(Softmax(x)), 0, ·)` (torch's exported SDPA) is absorbed by streaming attention",
    "GatherElements": "run-time or constant int64/int32 indices (an indirect index; negative ones wrap, out-of-range ones are clamped); float or integer data",
    "GatherND": "batch_dims; run-time or constant indices (one indirect index per gathered dimension); float data",
    "HardSigmoid": "alpha, beta; fused as a GEMM/conv epilogue",
    "HardSwish": "fused as a GEMM/conv epilogue",
    "Mish": "x·tanh(softplus(x)); fused as a GEMM/conv epilogue",
    "Softplus": "stated as max(x, 0) + log1p(exp(-|x|)) (never overflows); fused as a GEMM/conv epilogue",
    "Gelu": "opset 20; approximate none (erf) and tanh; fused as a GEMM/conv epilogue",
    "Abs": "float; run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "Sign": "float (0 and NaN map to themselves); run-time int64/int32 exact (int64 arithmetic in the kernel)",
    "Floor": "",
    "Ceil": "",
    "Round": "half to even",
    "Mod": "floats at run time: fmod=1 (C fmod), fmod=0 (floored, opset 28; refused on floats before it); integers at run time in int64, both modes (a zero divisor gives 0)",
    "Mean": "any number of float inputs, broadcasting",
    "Trilu": "upper and lower, constant k; at run time a map with an index condition (float, bool; integers exact to 2^24), on constants folded",
    # issue 18: data movement, reductions, selection, contractions
    "Tile": "constant repeats; a reshape, a broadcast (Expand) and a reshape, read in place by the consumer",
    "Pad": "constant mode, constant pads (negative ones crop), value and axes: one guarded read; edge/reflect/wrap refused",
    "DepthToSpace": "DCR and CRD, 4-D: a reshape, a transpose and a reshape (folded into the reader's access)",
    "SpaceToDepth": "DCR and CRD, 4-D: a reshape, a transpose and a reshape (folded into the reader's access)",
    "CumSum": "any constant axis, exclusive, reverse; float32/16 (a sum over a guarded window: quadratic in the "
              "axis's extent); run-time int64/int32 exact (an int64 sum: position ids); float64 refused",
    "ReduceMin": "one reduced axis (or several of extent 1); keepdims",
    "ReduceProd": "one reduced axis (or several of extent 1); keepdims",
    "ReduceL2": "one reduced axis (or several of extent 1); keepdims; sqrt of a sum of squares",
    "ArgMax": "any axis, keepdims, select_last_index; float input (NaNs ignored); axis under 2**24",
    "ArgMin": "any axis, keepdims, select_last_index; float input (NaNs ignored); axis under 2**24",
    "TopK": "constant k, any axis, largest/smallest, values and indices (sorted; ties to the lower index); "
            "float input without NaNs; quadratic in the axis's extent",
    "Einsum": "one or two operands, sums, transposes and contractions (batched, ellipsis, implicit output) as "
              "Transpose/Reshape/MatMul (the GEMM family); diagonals and three or more operands refused",
    "Cos": "float; on constants (rotary tables of static positions) folded at compile time",
    "ScatterND": "reduction none, float data, run-time or constant int64/int32 indices (negative ones wrap, "
                 "out-of-range ones write nothing); an updated graph input that is a graph output is state "
                 "(one device buffer, updated in place: only the indexed rows are written); other reductions refused",
    "Sin": "float; on constants (rotary tables of static positions) folded at compile time",
    # issue 18: normalization ops (frontend/import_norms.py)
    "RMSNormalization": "opset 23, any axis; one row pass (the mean square, as the exported RMSNorm); stash_type 1 only",
    "SimplifiedLayerNormalization": "onnxruntime's RMSNormalization (domain ''), any axis; its inv_std_var output too "
                                    "(computed apart); stash_type 1 only",
    "SkipLayerNormalization": "com.microsoft: input + skip (+ bias) stored by the LayerNormalization's row pass; "
                              "mean, inv_std_var (computed apart; float32 inputs) and input_skip_bias_sum outputs",
    "SkipSimplifiedLayerNormalization": "com.microsoft: input + skip (+ bias), then RMSNormalization in one row pass; "
                                        "inv_std_var and input_skip_bias_sum outputs; the mean output refused",
    "InstanceNormalization": "rank 3 or more: a row pass over each (n, channel) with the per-channel affine in it",
    "GroupNormalization": "opset 18 (scale/bias per group) and 21 (per channel): a row pass over each (n, group), "
                          "the affine map fused where its access is affine; stash_type 1 only",
    # issue 18: spatial ops of U-Nets, audio front ends and 3-D models
    "ConvTranspose": "1-D, 2-D, 3-D; strides, pads, output_padding, output_shape, auto_pad, dilations, groups: a "
                     "stride-1 Conv over the zero-inserted input (the implicit GEMM also multiplies the s^D-1 "
                     "inserted zeros of each input element)",
    "Resize": "nearest (round_prefer_floor/ceil, floor, ceil), linear and cubic (exclude_outside) over any axes; "
              "half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric; constant scales or "
              "sizes (axes, keep_aspect_ratio_policy): one map of table-indexed reads; tf_crop_and_resize and "
              "antialias refused",
    # activations of YOLO, GAN, face and self-normalizing models, and ONNX's other float functions
    "LeakyRelu": "alpha; fused as a GEMM/conv epilogue",
    "PRelu": "slope broadcast to x one way (a per-channel constant, or a run-time tensor); fused as a GEMM/conv "
             "epilogue",
    "Elu": "alpha; alpha·expm1(x) below 0; fused as a GEMM/conv epilogue",
    "Selu": "alpha, gamma; fused as a GEMM/conv epilogue",
    "Celu": "alpha (not 0); fused as a GEMM/conv epilogue",
    "ThresholdedRelu": "alpha (NaN gives 0, as onnxruntime); fused as a GEMM/conv epilogue",
    "Softsign": "x / (1 + |x|); fused as a GEMM/conv epilogue",
    "Shrink": "bias, lambd (NaN gives 0); fused as a GEMM/conv epilogue",
    "Swish": "opset 24, alpha: x·sigmoid(alpha·x); fused as a GEMM/conv epilogue",
    "Tan": "float; libm's tanf", "Asin": "float; NaN outside [-1, 1]", "Acos": "float; NaN outside [-1, 1]",
    "Atan": "float", "Sinh": "float", "Cosh": "float", "Asinh": "float", "Acosh": "float; NaN below 1",
    "Atanh": "float; NaN outside [-1, 1]",
    "Upsample": "opsets 7-9 (deprecated): Resize as opset 10 defines it (asymmetric, nearest rounding down, or "
                "linear); constant scales, as an input or the attribute",
    "LpNormalization": "p = 1 or 2, any axis: ReduceL1/ReduceL2 and Div (no epsilon; a zero norm gives 0, as "
                       "ONNX's reference); other p refused",
    "GlobalLpPool": "p = 1 or 2: ReduceL1/ReduceL2 over the merged spatial axes; other p refused",
    "Size": "folded at compile time (static shapes)",
    "Hardmax": "opset 13 (its axis alone; the older 2-D coercion where it differs refused): ArgMax == the axis's "
               "positions, cast (ties to the first maximum)",
    "OneHot": "run-time int64/int32 indices, or float ones cast to int64 (negative ones from the end, out-of-range ones all off), constant depth "
              "and values, any axis: a compare with the positions and a Where",
    "LogSoftmax": "any axis: x - max - log(sum(exp(x - max))), no log(0) where the softmax underflows",
    "GlobalMaxPool": "any rank >= 3; a row reduction",
    "ReduceSumSquare": "one reduced axis (or several of extent 1, or a run of consecutive ones); keepdims",
    "ReduceL1": "one reduced axis (or several of extent 1, or a run of consecutive ones); keepdims; a sum of |x|",
    "ReduceLogSum": "one reduced axis (or several of extent 1, or a run of consecutive ones); keepdims; log of a sum",
    "ReduceLogSumExp": "one reduced axis (or several of extent 1, or a run of consecutive ones); keepdims; "
                       "max + log(sum(exp(x - max))): no overflow (three kernels: the maximum, the sum, the map)",
}

BEGIN, END = "<!-- ops:begin -->", "<!-- ops:end -->"


def claimed() -> list[str]:
    from aicfc.frontend.onnx_import import IMPORT_ONLY
    from aicfc.ir.ops import OPS
    return sorted(set(OPS) | set(IMPORT_ONLY))


def markdown() -> str:
    """The README's support table."""
    lines = [BEGIN, "", "| op | notes |", "| --- | --- |"]
    lines += [f"| `{op}` | {NOTES[op]} |" for op in claimed()]
    return "\n".join(lines + ["", END])


def with_table(readme: str) -> str:
    """`readme` with the text between the markers replaced by the current table."""
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[:start] + markdown() + readme[end:]
