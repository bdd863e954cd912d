"""The op kinds of the code generator: what `legality.classify` returns for an op and what `lowering` dispatches
on, named once. A kind is how an XIR `*-fix` op runs on the DPU (the engine and the lowering), not its XIR type:
`eltwise-fix` is `elew`, `leaky`, `prelu` or `relu6` by its attributes."""
from __future__ import annotations

CONV = "conv"                 # conv2d-fix: CONV engine
TCONV = "tconv"               # transposed-conv2d-fix: stride^2 stride-1 CONV phases
DWCONV = "dwconv"             # depthwise-conv2d-fix: ALU
POOL = "pool"                 # pool-fix (max / average): ALU
LEAKY = "leaky"               # eltwise-fix LEAKY-RELU: ALU prelu mode with one slope
PRELU = "prelu"               # eltwise-fix PRELU with constant slopes: ALU
RELU6 = "relu6"               # eltwise-fix ADD of one input with RELU6: ALU 1x1 depthwise with weight 1
HSIGMOID = "hsigmoid"         # hard-sigmoid-fix: ALU
ELEW = "elew"                 # eltwise-fix ADD / MUL: ELEW engine
CONCAT = "concat"             # concat-fix: members written in place or copied (LOAD / SAVE, ELEW to rescale)
UPSAMPLE = "upsample"         # upsample-fix (nearest, integer scale): copies into strided views
TILE = "tile"                 # tile-fix (space-to-depth / depth-to-space): copies between strided views
VIEW = "view"                 # strided_slice-fix: a window of its input's image, copied only where needed
ALIAS = "alias"               # reshape / flatten / squeeze / identity: shares its input's image when it can
SKIP = "skip"                 # const / upload / download: no code

ALU_KINDS = (DWCONV, POOL, LEAKY, HSIGMOID, RELU6, PRELU)
NO_CODE = (SKIP, ALIAS, VIEW)                 # kinds the driver handles without a lowering
FUSE_PRODUCERS = (CONV,) + ALU_KINDS          # a producer `fusion` may keep on chip for its only consumer
# kinds whose output may be written straight into its concat consumer's image (a member view)
MEMBER_KINDS = (CONV, TCONV, DWCONV, POOL, ELEW, LEAKY, PRELU, RELU6, HSIGMOID, UPSAMPLE, TILE)

ALIAS_TYPES = {"reshape-fix", "reshape", "flatten", "flatten-fix", "squeeze", "identity", "identity-fix"}
SKIP_TYPES = {"const-fix", "const", "upload", "download"}

# instruction mnemonics by role (isa.fields.OPS)
COMPUTE_OPS = ("CONV", "ALU", "ELEW")
INIT_OPS = ("CONVINIT", "ALUINIT", "ELEWINIT")
