"""Grouped quantization (include/sfmoe/quantize.h, rules in docs/quantization.md): quantize a
[rows, cols] tensor whose rows form groups into FP8 per-tensor / blockwise, MXFP8 or NVFP4, with a
rowwise and / or a columnwise (transposed) copy; dequantize it; the per-group amax; the scale
swizzle. Outputs are allocated on the input's device with the input's framework and the work runs
on the current stream, without synchronizing or reading device data on the host."""

import dataclasses
import numbers

from . import _C, _arrays
from ._dtypes import DType, ScaleLayout, Scaling, as_dtype
from ._status import StatusWord

# Recipe name -> the output's scaling mode.
RECIPES = {
    "fp8_tensor": Scaling.TENSOR,
    "fp8_block_1x128": Scaling.BLOCK_1X128,
    "fp8_block_128x128": Scaling.BLOCK_128X128,
    "mxfp8": Scaling.MX_1X32,
    "nvfp4": Scaling.NV_1X16,
    "nvfp4_2d": Scaling.NV_16X16,
}
_RECIPE_OF = {scaling: name for name, scaling in RECIPES.items()}

_NVFP4 = (Scaling.NV_1X16, Scaling.NV_16X16)
_SWIZZLABLE = (Scaling.MX_1X32, Scaling.NV_1X16)
_HIGH_PRECISION = (DType.FP32, DType.BF16, DType.FP16)
_SOURCES = {
    "auto": _C.DEQUANTIZE_AUTO,
    "rowwise": _C.DEQUANTIZE_ROWWISE,
    "columnwise": _C.DEQUANTIZE_COLUMNWISE,
}


def _recipe_scaling(recipe):
    if isinstance(recipe, str) and recipe.lower() in RECIPES:
        return RECIPES[recipe.lower()]
    raise ValueError(f"recipe: expected one of {', '.join(RECIPES)}, got {recipe!r}")


def min_row_alignment(recipe, columnwise=False):
    """The smallest output row alignment `recipe` allows (docs/quantization.md): the block height
    for 2D blocks and for a columnwise copy (blocks that run down the rows must not cross a group
    boundary), else 1."""
    return _C.min_row_alignment(int(_recipe_scaling(recipe)), bool(columnwise))


def _element_dtype(scaling, fmt):
    name = fmt.lower() if isinstance(fmt, str) else fmt
    if scaling in _NVFP4:
        # NVFP4 holds E2M1 elements (with E4M3 block scales): "e4m3", the default, is accepted.
        if name in ("e4m3", "fp8_e4m3", "e2m1", "fp4", "fp4_e2m1", DType.FP4_E2M1):
            return DType.FP4_E2M1
        raise ValueError(f"fmt: the NVFP4 recipes hold fp4_e2m1 elements with e4m3 block scales; got {fmt!r}")
    if name in ("e4m3", "fp8_e4m3", "float8_e4m3fn", DType.FP8_E4M3):
        return DType.FP8_E4M3
    if name in ("e5m2", "fp8_e5m2", "float8_e5m2", DType.FP8_E5M2):
        return DType.FP8_E5M2
    raise ValueError(f"fmt: expected 'e4m3' or 'e5m2', got {fmt!r}")


def _scale_layout(scale_layout, scaling):
    if isinstance(scale_layout, ScaleLayout):
        layout = scale_layout
    elif isinstance(scale_layout, str) and scale_layout.upper() in ScaleLayout.__members__:
        layout = ScaleLayout[scale_layout.upper()]
    else:
        raise ValueError(
            f"scale_layout: expected 'compact', 'swizzled' or 'columnwise_transposed', got {scale_layout!r}"
        )
    if layout == ScaleLayout.SWIZZLED and scaling not in _SWIZZLABLE:
        raise ValueError(
            f"scale_layout: the swizzled layout exists for mxfp8 and nvfp4 only, not {_RECIPE_OF[scaling]}"
        )
    if layout == ScaleLayout.COLUMNWISE_TRANSPOSED and scaling != Scaling.BLOCK_1X128:
        raise ValueError(
            f"scale_layout: the columnwise_transposed layout exists for fp8_block_1x128 only, not {_RECIPE_OF[scaling]}"
        )
    return layout


def _integer(value, what, minimum=None, maximum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what}: expected an integer, got {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"[{minimum}, {'inf' if maximum is None else maximum}]"
        raise ValueError(f"{what}: {value} is outside {bounds}")
    return value


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """The options of a grouped quantization (``sfmoe_quantize_config``).

    power_of_two_scales: FP8 tensor / blockwise scales rounded down to powers of two.
    stochastic_rounding: NVFP4 E2M1 codes rounded stochastically from the Philox stream
        (seed, offset); results depend only on them and the element's position.
    hadamard: NVFP4 1x16: the 16-point random Hadamard transform on the columnwise copy.
    trap_nan_amax: a NaN group or block amax raises Fault.NAN_AMAX in the status word.
    tensor_scales: fp8_tensor only: each group's scale given (delayed scaling), a float32
        [num_groups] array on the data's device, used as is; None: current scaling from each
        group's amax. Lets permute and the activations quantize fp8_tensor rows in one pass.
    group_amax: fp8_tensor (current scaling) and the NVFP4 recipes (not with the Hadamard
        transform's columnwise copy): each group's amax given, a float32 [num_groups] array on the
        data's device; the scales follow from it and x is read once; the result's amax is a copy;
        values beyond it saturate. None: computed from x.
    """

    power_of_two_scales: bool = False
    stochastic_rounding: bool = False
    seed: int = 0
    offset: int = 0
    hadamard: bool = False
    trap_nan_amax: bool = False
    # The array, prepared for the library (bound afresh for every call: a DLPack capsule is used
    # up by one import); not compared or hashed.
    tensor_scales: object = dataclasses.field(default=None, compare=False)
    _scales_adapter: object = dataclasses.field(default=None, compare=False, repr=False)
    group_amax: object = dataclasses.field(default=None, compare=False)
    _amax_adapter: object = dataclasses.field(default=None, compare=False, repr=False)

    def _fields(self):
        return {
            "tensor_scales": None
            if self.tensor_scales is None
            else self._scales_adapter.for_binding(self.tensor_scales),
            "group_amax": None if self.group_amax is None else self._amax_adapter.for_binding(self.group_amax),
            "power_of_two_scales": int(self.power_of_two_scales),
            "stochastic_rounding": int(self.stochastic_rounding),
            "seed": self.seed,
            "offset": self.offset,
            "hadamard_columnwise": int(self.hadamard),
            "trap_nan_amax": int(self.trap_nan_amax),
        }


@dataclasses.dataclass
class GroupedQuantizedTensor:
    """A grouped tensor quantized by :func:`sfmoe.quantize` (layouts: docs/quantization.md).

    data: the rowwise copy, [rows, cols] codes (FP4: [rows, cols / 2] bytes), or None.
    columnwise_data: the columnwise copy, the transposed matrix [cols, rows] quantized along its
        own rows (FP4: [cols, rows / 2]), or None.
    scale_inv, columnwise_scale_inv: each copy's scales (None without the copy): float32 for
        fp8_tensor ([num_groups]) and the FP8 block recipes; E8M0 (mxfp8) or E4M3 (nvfp4) bytes.
        Compact: [rows, cols / B] / [cols, rows / B] for 1D blocks of B, [rows / B, cols / B] /
        [cols / B, rows / B] for B x B blocks. Swizzled: 1-D, the tensor-core layout of the
        compact matrix (:func:`sfmoe.unswizzle_scales` undoes it; see :meth:`compact_scale_inv`).
    amax: [num_groups] float32 group amax (fp8_tensor and NVFP4), else None.
    columnwise_amax: [num_groups] amax of the Hadamard-transformed columnwise copy (nvfp4 with
        hadamard and a columnwise copy), else None.
    group_offsets: [num_groups + 1] int64, the padded output offsets (each group starts at a
        multiple of row_alignment), or None with uniform groups.
    recipe, dtype (of the elements), scale_layout, row_alignment, rows (the row capacity), cols,
    num_groups, uniform_group_rows (0 unless the groups are uniform), config (the options used).

    Rows at and beyond group_offsets[num_groups] (and their scales) are not written.
    """

    data: object
    columnwise_data: object
    scale_inv: object
    columnwise_scale_inv: object
    amax: object
    columnwise_amax: object
    group_offsets: object
    recipe: str
    dtype: DType
    scale_layout: ScaleLayout
    row_alignment: int
    rows: int
    cols: int
    num_groups: int
    config: QuantizeConfig
    uniform_group_rows: int = 0

    @property
    def scaling(self):
        return RECIPES[self.recipe]

    @property
    def shape(self):
        """(rows, cols) of the quantized matrix (the row capacity, not the rows in use)."""
        return (self.rows, self.cols)

    def dequantize(self, out_dtype=DType.FP32, source="auto", *, out=None):
        return dequantize_grouped(self, out_dtype, source, out)

    def compact_scale_inv(self, columnwise=False):
        """One copy's scales in the compact layout (unswizzled if need be)."""
        scales = self.columnwise_scale_inv if columnwise else self.scale_inv
        if scales is None or self.scale_layout == ScaleLayout.COMPACT:
            return scales
        block = _C.scaling_block_size(int(self.scaling))
        rows, cols = (self.cols, self.rows) if columnwise else (self.rows, self.cols)
        if self.scale_layout == ScaleLayout.COLUMNWISE_TRANSPOSED:  # one dimension, either copy
            if not columnwise:
                return scales.reshape(rows, cols // block)
            transposed = scales.reshape(cols // block, rows).T
            return transposed.contiguous() if hasattr(transposed, "contiguous") else transposed.copy()
        return unswizzle_scales(scales, rows, cols // block, dtype=_C.scale_dtype(self.scaling))

    # The array fields, in the order flatten() returns them.
    ARRAY_FIELDS = (
        "data",
        "columnwise_data",
        "scale_inv",
        "columnwise_scale_inv",
        "amax",
        "columnwise_amax",
        "group_offsets",
    )
    # The config's scalar options, in the order flatten() puts them in its metadata.
    _CONFIG_OPTIONS = ("power_of_two_scales", "stochastic_rounding", "seed", "offset", "hadamard", "trap_nan_amax")

    def flatten(self):
        """(arrays, metadata): the arrays present, in ARRAY_FIELDS order, and a hashable tuple of
        everything else (the names of the arrays present, the layout fields and the scalar options
        of the config). What a torch custom op returns and a JAX pytree holds;
        :meth:`unflatten` rebuilds the tensor. The config's tensor_scales and group_amax (inputs of
        the quantization that made the tensor) do not travel."""
        present = tuple(name for name in self.ARRAY_FIELDS if getattr(self, name) is not None)
        options = tuple(getattr(self.config, name) for name in self._CONFIG_OPTIONS)
        metadata = (
            present,
            self.recipe,
            int(self.dtype),
            int(self.scale_layout),
            self.row_alignment,
            self.rows,
            self.cols,
            self.num_groups,
            self.uniform_group_rows,
            options,
        )
        return tuple(getattr(self, name) for name in present), metadata

    @classmethod
    def unflatten(cls, arrays, metadata):
        """The tensor :meth:`flatten` took apart (the arrays may be new ones of the same shapes, e.g.
        a custom op's outputs)."""
        present, recipe, dtype, layout, alignment, rows, cols, groups, uniform, options = metadata
        arrays = tuple(arrays)
        if len(arrays) != len(present):
            raise ValueError(f"unflatten: {len(present)} arrays ({', '.join(present)}) expected, got {len(arrays)}")
        fields = dict.fromkeys(cls.ARRAY_FIELDS)
        fields.update(zip(present, arrays))
        config = QuantizeConfig(**dict(zip(cls._CONFIG_OPTIONS, options, strict=True)))
        return cls(
            **fields,
            recipe=recipe,
            dtype=DType(dtype),
            scale_layout=ScaleLayout(layout),
            row_alignment=alignment,
            rows=rows,
            cols=cols,
            num_groups=groups,
            config=config,
            uniform_group_rows=uniform,
        )

    def _descriptor(self, adapter):
        bind = _binder(adapter)
        return {
            "dtype": int(self.dtype),
            "scaling": int(self.scaling),
            "scale_layout": int(self.scale_layout),
            "num_groups": self.num_groups,
            "row_capacity": self.rows,
            "cols": self.cols,
            "row_alignment": self.row_alignment,
            "uniform_group_rows": self.uniform_group_rows,
            "group_offsets": bind(self.group_offsets),
            "rowwise_data": bind(self.data),
            "rowwise_scale_inv": bind(self.scale_inv),
            "columnwise_data": bind(self.columnwise_data),
            "columnwise_scale_inv": bind(self.columnwise_scale_inv),
            "amax": bind(self.amax),
            "columnwise_amax": bind(self.columnwise_amax),
        }


def _binder(adapter):
    """Arrays as the binding takes them. The library wants a pointer for every buffer it is given,
    empty ones included, and frameworks export empty arrays as NULL: those are passed as a
    one-element stand-in (the descriptor's sizes, not the array's, say that nothing is there)."""

    def bind(array):
        if array is None:
            return None
        if 0 in adapter.shape(array):
            array = adapter.stand_in(array)
        return adapter.for_binding(array)

    return bind


def _check_status_word(status_word, adapter, x):
    if status_word is None:
        return None
    if not isinstance(status_word, StatusWord):
        raise TypeError(f"status_word: expected an sfmoe.StatusWord, got {status_word!r}")
    if status_word.device != ("cpu" if adapter.is_host(x) else adapter.device_name(x)):
        raise ValueError(f"status_word: the word is on {status_word.device} but the data on {adapter.device_name(x)}")
    return status_word._word


def _high_precision_input(x, what):
    """(adapter, x): a 2-D FP32 / BF16 / FP16 array ready for the library."""
    adapter, x = _arrays.adapt(x, what)
    dtype = _arrays.resolve_dtype(adapter, x, None, what)
    if dtype not in _HIGH_PRECISION:
        raise TypeError(f"{what}: expected float32, bfloat16 or float16 values, got {dtype.c_name}")
    shape = adapter.shape(x)
    if len(shape) != 2:
        raise ValueError(f"{what}: expected a 2-D [rows, cols] array, got shape {shape}")
    return adapter, adapter.prepare_input(x), dtype


def _groups(adapter, x, group_offsets, uniform_group_rows):
    """(offsets array or None, uniform rows or 0, num_groups) of the input's groups."""
    rows = adapter.shape(x)[0]
    if group_offsets is not None and uniform_group_rows is not None:
        raise ValueError("pass group_offsets or uniform_group_rows, not both")
    if uniform_group_rows is not None:
        n = _integer(uniform_group_rows, "uniform_group_rows", 1)
        if rows % n or rows == 0:
            raise ValueError(
                f"uniform_group_rows: {rows} rows do not split into groups of {n} (the groups cover the rows exactly)"
            )
        return None, n, rows // n
    if group_offsets is None:  # one group of all the rows
        return adapter.one_group_offsets(rows, x), 0, 1
    if isinstance(group_offsets, (list, tuple)):
        if not adapter.is_host(x):
            raise TypeError(
                "group_offsets: pass an int64 array on the data's device (a Python sequence "
                "would need a copy to the device)"
            )
        values = [_integer(v, "group_offsets[i]") for v in group_offsets]
        offsets = adapter.int64_from_values(values, x)
    else:
        offsets_adapter, offsets = _arrays.adapt(group_offsets, "group_offsets")
        if offsets_adapter is not adapter:
            raise TypeError(
                f"group_offsets: must be the same kind of array as x ({adapter.name}), got {offsets_adapter.name}"
            )
        if offsets_adapter.dtype_name(offsets) != "int64":
            raise TypeError(f"group_offsets: expected int64 offsets, got {offsets_adapter.dtype_name(offsets)}")
        if not adapter.same_device(offsets, x):
            raise ValueError(
                f"group_offsets: the offsets are on {adapter.device_name(offsets)} but x on {adapter.device_name(x)}"
            )
        offsets = adapter.prepare_input(offsets)
    shape = adapter.shape(offsets)
    if len(shape) != 1 or shape[0] < 2:
        raise ValueError(f"group_offsets: expected a 1-D array of num_groups + 1 >= 2 entries, got shape {shape}")
    return offsets, 0, shape[0] - 1


def _input_descriptor(adapter, x, dtype, offsets, uniform_rows, num_groups):
    rows, cols = adapter.shape(x)
    bind = _binder(adapter)
    return {
        "dtype": int(dtype),
        "scaling": int(Scaling.NONE),
        "num_groups": num_groups,
        "row_capacity": rows,
        "cols": cols,
        "row_alignment": 1,
        "uniform_group_rows": uniform_rows,
        "group_offsets": bind(offsets),
        "rowwise_data": bind(x),
    }


def quantize(
    x,
    recipe,
    *,
    group_offsets=None,
    uniform_group_rows=None,
    rowwise=True,
    columnwise=False,
    fmt="e4m3",
    scale_layout="compact",
    row_alignment=None,
    power_of_two_scales=False,
    stochastic_rounding=False,
    seed=0,
    offset=0,
    hadamard=False,
    trap_nan_amax=False,
    out_row_capacity=None,
    status_word=None,
    tensor_scales=None,
    group_amax=None,
):
    """Grouped quantization of `x` (docs/python.md, rules in docs/quantization.md).

    x: a 2-D [rows, cols] float32 / bfloat16 / float16 NumPy array, torch.Tensor (CPU or CUDA) or
       CuPy array whose rows form the groups.
    recipe: "fp8_tensor", "fp8_block_1x128", "fp8_block_128x128", "mxfp8", "nvfp4", "nvfp4_2d".
    group_offsets: int64 [num_groups + 1] row offsets on x's device (a list for host arrays), or
       uniform_group_rows: groups of that many rows covering x; neither: one group of all rows.
    rowwise, columnwise: which copies to produce.
    fmt: "e4m3" or "e5m2" for the FP8 recipes (the NVFP4 recipes always hold E2M1).
    scale_layout: "compact", "swizzled" (mxfp8 and nvfp4) or "columnwise_transposed" (fp8_block_1x128:
       the columnwise copy's scales as [R / 128, C], the layout the grouped GEMM's blockwise wgrad
       reads).
    row_alignment: each output group starts at a multiple of it (a power of two, a multiple of
       :func:`min_row_alignment`, which is the default); groups are padded with zero rows.
    out_row_capacity: rows of the output; by default the bound the library requires:
       rows + num_groups * (row_alignment - 1) (uniform groups: rows), rounded up to the block
       height when a columnwise copy or 2D blocks need it, to row_alignment with a columnwise
       copy (whose column starts the FP8 grouped GEMM reads aligned) and to even for FP4; for a
       columnwise mxfp8 / fp8_block_1x128 copy with compact scales, from 16384 rows on, to a
       multiple of 1024 (the kernel then writes those scales in whole sectors, docs/quantization.md).
    power_of_two_scales, stochastic_rounding, seed, offset, hadamard, trap_nan_amax,
       tensor_scales, group_amax: see :class:`QuantizeConfig`. status_word: an :class:`sfmoe.StatusWord` on x's device that
       records faults (bad offsets, NaN amax with trap_nan_amax), or None.
    Returns a :class:`GroupedQuantizedTensor` whose arrays live on x's device.
    """
    scaling = _recipe_scaling(recipe)
    dtype = _element_dtype(scaling, fmt)
    layout = _scale_layout(scale_layout, scaling)
    rowwise, columnwise = bool(rowwise), bool(columnwise)
    if not (rowwise or columnwise):
        raise ValueError("rowwise and columnwise are both False: there is nothing to produce")
    config = QuantizeConfig(
        power_of_two_scales=bool(power_of_two_scales),
        stochastic_rounding=bool(stochastic_rounding),
        seed=_integer(seed, "seed", 0, 2**64 - 1),
        offset=_integer(offset, "offset", 0, 2**64 - 1),
        hadamard=bool(hadamard),
        trap_nan_amax=bool(trap_nan_amax),
    )
    adapter, x, in_dtype = _high_precision_input(x, "x")
    word = _check_status_word(status_word, adapter, x)
    rows, cols = adapter.shape(x)

    block = _C.scaling_block_size(int(scaling))
    if block and cols % block:
        raise ValueError(
            f"x: recipe {_RECIPE_OF[scaling]} scales blocks of {block} columns, so cols must be a "
            f"multiple of {block} (got {cols})"
        )
    offsets, uniform_rows, num_groups = _groups(adapter, x, group_offsets, uniform_group_rows)
    config = with_tensor_scales(config, scaling, tensor_scales, num_groups)
    config = with_group_amax(config, scaling, group_amax, num_groups, columnwise)

    if row_alignment is None:
        a = 0  # the recipe's minimum, as the library plans it
    else:
        a = _integer(row_alignment, "row_alignment", 1)
        if a & (a - 1):
            raise ValueError(f"row_alignment: must be a power of two, got {a}")
    capacity = 0  # the library's default
    if out_row_capacity is not None:
        capacity = _integer(out_row_capacity, "out_row_capacity", 0)
        if dtype == DType.FP4_E2M1 and capacity % 2:
            raise ValueError(f"out_row_capacity: fp4_e2m1 tensors need an even row capacity, got {capacity}")
    plan = plan_quantize(
        dtype, scaling, layout, rowwise, columnwise, config.hadamard, num_groups, cols, rows, uniform_rows, a, capacity
    )
    q = _from_plan(adapter, x, plan, config)
    with adapter.device_context(x):
        _C.grouped_quantize(
            _input_descriptor(adapter, x, in_dtype, offsets, uniform_rows, num_groups),
            q._descriptor(adapter),
            config._fields(),
            word,
            adapter.stream(x),
        )
    return q


def plan_quantize(
    dtype, scaling, layout, rowwise, columnwise, hadamard, num_groups, cols, rows, uniform_rows, row_alignment, capacity
):
    """The C planner's layout (a `_C.plan_grouped_quantize` dict) of a grouped quantization of
    `rows` input rows (row_alignment and capacity 0: the library's defaults)."""
    return _C.plan_grouped_quantize(
        dict(
            dtype=int(dtype),
            scaling=int(scaling),
            scale_layout=int(layout),
            rowwise=bool(rowwise),
            columnwise=bool(columnwise),
            hadamard_columnwise=bool(hadamard and columnwise),
            num_groups=num_groups,
            cols=cols,
            input_rows=rows,
            input_row_alignment=1,
            uniform_group_rows=uniform_rows,
            row_alignment=row_alignment,
            row_capacity=capacity,
        )
    )


# Each array field of GroupedQuantizedTensor and the planned buffer that holds it.
PLANNED_BUFFERS = {
    "data": "rowwise_data",
    "columnwise_data": "columnwise_data",
    "scale_inv": "rowwise_scale_inv",
    "columnwise_scale_inv": "columnwise_scale_inv",
    "amax": "amax",
    "columnwise_amax": "columnwise_amax",
    "group_offsets": "group_offsets",
}


def tensor_from_plan(plan, config, arrays):
    """The GroupedQuantizedTensor of `plan` with `arrays` ({field: array}, absent ones None)."""
    return GroupedQuantizedTensor(
        **arrays,
        recipe=_RECIPE_OF[Scaling(plan["scaling"])],
        dtype=DType(plan["dtype"]),
        scale_layout=ScaleLayout(plan["scale_layout"]),
        row_alignment=plan["row_alignment"],
        rows=plan["row_capacity"],
        cols=plan["cols"],
        num_groups=plan["num_groups"],
        config=config,
        uniform_group_rows=plan["uniform_group_rows"],
    )


def _from_plan(adapter, like, plan, config, group_offsets=None):
    """An empty GroupedQuantizedTensor holding the buffers of `plan` (a `_C.plan_*` dict) on like's
    device; group_offsets: an offsets array to use instead of the planned one."""
    arrays = {
        field: _arrays.empty_planned(adapter, plan["buffers"][name], like, name)
        for field, name in PLANNED_BUFFERS.items()
    }
    if group_offsets is not None:
        arrays["group_offsets"] = group_offsets
    return tensor_from_plan(plan, config, arrays)


def with_tensor_scales(config, scaling, tensor_scales, num_groups):
    """`config` carrying tensor_scales (float32 [num_groups], fp8_tensor only), or unchanged."""
    if tensor_scales is None:
        return config
    if scaling != Scaling.TENSOR:
        raise ValueError("tensor_scales: only the fp8_tensor recipe takes given scales")
    adapter, scales, _ = _arrays.checked_input(tensor_scales, "tensor_scales", (DType.FP32,), ndim=1)
    if adapter.shape(scales)[0] != num_groups:
        raise ValueError(f"tensor_scales: expected [{num_groups}] (one per group), got {adapter.shape(scales)}")
    return dataclasses.replace(config, tensor_scales=scales, _scales_adapter=adapter)


def with_group_amax(config, scaling, group_amax, num_groups, columnwise):
    """`config` carrying group_amax (float32 [num_groups]; fp8_tensor and NVFP4), or unchanged."""
    if group_amax is None:
        return config
    if scaling not in (Scaling.TENSOR, Scaling.NV_1X16, Scaling.NV_16X16):
        raise ValueError("group_amax: only the fp8_tensor and NVFP4 recipes take a given amax")
    if config.tensor_scales is not None:
        raise ValueError("group_amax and tensor_scales are exclusive (given scales do not depend on the amax)")
    if config.hadamard and columnwise:
        raise ValueError(
            "group_amax: not with the Hadamard-transformed columnwise copy (its amax is that of the "
            "transformed values, which is computed)"
        )
    adapter, amax, _ = _arrays.checked_input(group_amax, "group_amax", (DType.FP32,), ndim=1)
    if adapter.shape(amax)[0] != num_groups:
        raise ValueError(f"group_amax: expected [{num_groups}] (one per group), got {adapter.shape(amax)}")
    return dataclasses.replace(config, group_amax=amax, _amax_adapter=adapter)


def fused_rows_format(recipe, fmt, scale_layout, cols, dtype):
    """The planning fields (dtype, scaling, scale_layout) of the rows an op writes (permute's and
    the activations'): quantized on the fly into `recipe`, or plain rows of `dtype` when recipe is
    None."""
    if recipe is None:
        return dict(dtype=int(dtype), scaling=int(Scaling.NONE), scale_layout=int(ScaleLayout.COMPACT))
    scaling = _recipe_scaling(recipe)
    block = _C.scaling_block_size(int(scaling)) or (8 if scaling == Scaling.TENSOR else 0)
    if block and cols % block:
        raise ValueError(f"recipe {recipe} scales blocks of {block} columns, so cols must be a multiple of {block}")
    return dict(
        dtype=int(_element_dtype(scaling, fmt)),
        scaling=int(scaling),
        scale_layout=int(_scale_layout(scale_layout, scaling)),
    )


def quantized_rows(adapter, x, recipe, power_of_two_scales, plan, group_offsets, tensor_scales=None):
    """An empty rowwise-only GroupedQuantizedTensor laid out by `plan` (the op's planned output)
    whose offsets array is `group_offsets` (None: a planned one), for ops that write quantized rows
    (permute's and the activations' fused quantization; fp8_tensor there needs tensor_scales, the
    given per-group scales)."""
    scaling = _recipe_scaling(recipe)
    config = with_tensor_scales(
        QuantizeConfig(power_of_two_scales=bool(power_of_two_scales)), scaling, tensor_scales, plan["num_groups"]
    )
    return _from_plan(adapter, x, plan, config, group_offsets)


def dequantize_grouped(q, out_dtype=DType.FP32, source="auto", out=None):
    """Decodes `q` into [q.rows, q.cols] values of `out_dtype` (FP32, BF16 or FP16) on q's
    device: rows [0, group_offsets[num_groups]) are written (padding rows as zeros); a fresh
    output is zero beyond them. `source`: "auto" (the rowwise copy if present), "rowwise" or
    "columnwise" (transposed back, the Hadamard transform undone)."""
    out_dtype = as_dtype(out_dtype, "out_dtype")
    if out_dtype not in _HIGH_PRECISION:
        raise ValueError(f"out_dtype: expected fp32, bf16 or fp16, got {out_dtype.c_name}")
    if not isinstance(source, str) or source.lower() not in _SOURCES:
        raise ValueError(f"source: expected 'auto', 'rowwise' or 'columnwise', got {source!r}")
    source = source.lower()
    if source == "rowwise" and q.data is None:
        raise ValueError("source: the tensor has no rowwise copy")
    if source == "columnwise" and q.columnwise_data is None:
        raise ValueError("source: the tensor has no columnwise copy")
    like = q.data if q.data is not None else q.columnwise_data
    adapter, like = _arrays.adapt(like, "q.data")
    if out is None:
        out = adapter.zeros((q.rows, q.cols), out_dtype, like)
    else:
        out_adapter, out = _arrays.adapt(out, "out")
        if out_adapter is not adapter:
            raise TypeError(f"out: must be the same kind of array as q's data ({adapter.name})")
        _arrays.resolve_dtype(adapter, out, out_dtype, "out")
        adapter.check_output(out, "out")
        if adapter.shape(out) != (q.rows, q.cols):
            raise ValueError(f"out: expected shape {(q.rows, q.cols)}, got {adapter.shape(out)}")
    bind = _binder(adapter)
    output = {
        "dtype": int(out_dtype),
        "scaling": int(Scaling.NONE),
        "num_groups": q.num_groups,
        "row_capacity": q.rows,
        "cols": q.cols,
        "row_alignment": 1,
        "uniform_group_rows": q.uniform_group_rows,
        # The library's descriptor wants the groups of every grouped tensor; the op reads q's.
        "group_offsets": bind(q.group_offsets),
        "rowwise_data": bind(out),
    }
    with adapter.device_context(like):
        _C.grouped_dequantize(
            q._descriptor(adapter),
            output,
            _SOURCES[source],
            q.config._fields(),
            adapter.stream(like),
        )
    return out


def grouped_amax(x, group_offsets=None, *, uniform_group_rows=None, status_word=None):
    """[num_groups] float32 on x's device: the largest |value| of each group's rows (NaN if any is
    NaN, 0 for an empty group). Groups as for :func:`quantize`."""
    adapter, x, in_dtype = _high_precision_input(x, "x")
    word = _check_status_word(status_word, adapter, x)
    offsets, uniform_rows, num_groups = _groups(adapter, x, group_offsets, uniform_group_rows)
    amax = adapter.empty((num_groups,), DType.FP32, x)
    with adapter.device_context(x):
        _C.grouped_amax(
            _input_descriptor(adapter, x, in_dtype, offsets, uniform_rows, num_groups),
            _binder(adapter)(amax),
            word,
            adapter.stream(x),
        )
    return amax


def _scale_input(scales, dtype, what):
    adapter, scales = _arrays.adapt(scales, what)
    dtype = _arrays.resolve_dtype(adapter, scales, dtype, what, raw_codes_option="dtype")
    if dtype not in (DType.E8M0, DType.FP8_E4M3):
        raise ValueError(f"{what}: scales are e8m0 or fp8_e4m3 bytes, got {dtype.c_name}")
    return adapter, adapter.prepare_input(scales), dtype


def _scale_output(adapter, out, shape, dtype, like):
    return _arrays.output_array(adapter, out, shape, dtype, like, "the scales")


def swizzle_scales(scales, *, dtype=None, out=None):
    """The compact [rows, scale_cols] E8M0 / E4M3 scale matrix `scales` in the tensor-core
    layout: a 1-D array of swizzled_scale_padded_size(rows, scale_cols) bytes, padding entries 0.
    Raw uint8 codes need `dtype` ("e8m0" or "fp8_e4m3")."""
    adapter, scales, dtype = _scale_input(scales, dtype, "scales")
    shape = adapter.shape(scales)
    if len(shape) != 2:
        raise ValueError(f"scales: expected a 2-D [rows, scale_cols] matrix, got shape {shape}")
    rows, scale_cols = shape
    size = _C.swizzled_scale_padded_size(rows, scale_cols)
    out = _scale_output(adapter, out, (size,), dtype, scales)
    with adapter.device_context(scales):
        _C.swizzle_scales(
            adapter.for_binding(scales),
            int(dtype),
            rows,
            scale_cols,
            adapter.for_binding(out),
            int(dtype),
            adapter.stream(scales),
        )
    return out


def unswizzle_scales(swizzled, rows, scale_cols, *, dtype=None, out=None):
    """The compact [rows, scale_cols] matrix of scales stored in the tensor-core layout."""
    adapter, swizzled, dtype = _scale_input(swizzled, dtype, "swizzled")
    rows = _integer(rows, "rows", 0)
    scale_cols = _integer(scale_cols, "scale_cols", 0)
    out = _scale_output(adapter, out, (rows, scale_cols), dtype, swizzled)
    with adapter.device_context(swizzled):
        _C.unswizzle_scales(
            adapter.for_binding(swizzled),
            int(dtype),
            rows,
            scale_cols,
            adapter.for_binding(out),
            int(dtype),
            adapter.stream(swizzled),
        )
    return out
