// y[t, row] (+)= sum_e W[row, e] * x[t, e], reading W's raw blocks (unit_w, from the quant_*.wgsl
// prepended, decodes 8 weights at a time).
// TPR threads share one row (striding over its 8-element units, then a reduction), so a workgroup
// covers WG / TPR rows; TPR = 1 needs no reduction nor barrier, which suits CPU adapters.
// Each thread applies every decoded unit to TB tokens: the weights are read once per TB tokens
// (TB = 1 for decoding, more for prefill, where this is the tiled matrix-matrix product).
// Workgroups past 65535 spill into wid.y; wid.z picks the group of TB tokens. SWIGLU (a constant)
// makes the input silu(gate) * up of a [gate | up] row (see x_at), GELU with it gelu(gate) * up
// (Gemma's tanh form); NORM makes it RMSNorm(x) * NormW:
// the threads of a row see every input of the token while they walk the row, so they sum its
// squares on the way and the row's dot product is scaled by 1 / RMS at the end (norm_w, defined by
// the host: the NormW binding exists only in that variant): no separate normalisation pass.
// ROPE (a constant; the host prepends rope_epilogue, its bindings and kv_t) makes this the stacked
// q/k/v projection of a model whose rotation pairs adjacent dimensions (llama's "normal" rope): rows
// 2i and 2i+1 sit in one workgroup (RPW is even), so each q and k row is rotated against its partner
// here, and the k and v rows are stored into the KV cache at the token's position: no separate
// rope/store dispatch.
// With TB > 1 (prefill) the workgroup stages the inputs of its TB tokens in workgroup memory, CHUNK
// columns at a time (normalised and SwiGLU'd once there, not once per row), and every row of the
// workgroup reads them from there: the tiled matrix-matrix product.
// SUBGROUPS (a constant, where the adapter has subgroups) sums a row's TPR partial sums with subgroup
// shuffles (lanes_sum, prepended by the host), then adds the few subgroups a row spans where
// subgroups are narrower than TPR: one barrier instead of a log2(TPR)-level tree.

const RPW: u32 = WG / TPR;
const TILED: bool = TB > 1u;
// Input columns staged at once in the tiled (TB > 1) product: a multiple of 8.
const CHUNK: u32 = 256u;

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    units: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    accumulate: u32,
    tokens: u32,
    eps: f32,
    pad1: u32,
    head_dim: u32,
    n_rot: u32,
    q_dim: u32,
    kv_dim: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> partial: array<f32, WG * TB>;
var<workgroup> partial_sq: array<f32, WG * TB>;
// The staged inputs of the tiled product: CHUNK columns of TB tokens, 4 at a time.
var<workgroup> xs: array<vec4<f32>, TB * CHUNK / 4u>;
// Each row's result, where the ROPE epilogue finds a row's rotation partner.
var<workgroup> rowv: array<f32, RPW * TB>;

fn x_at(xo: u32, e: u32) -> f32 {
    // Input e of the token whose row starts at xo; zero at or past cols (float rows need not be a
    // multiple of 8 long). With SWIGLU the row is [gate | up] and the value silu(gate) * up: the
    // down projection reads the feed-forward's activation without a separate SwiGLU dispatch.
    let i = xo + min(e, P.cols - 1u);
    var v = X[i];
    if (SWIGLU && GELU) {
        // 0.5 v (1 + tanh(u)) is v * sigmoid(2u): exp saturates to 0 or inf where tanh's quotient
        // form would give inf / inf.
        let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
        v = v / (1.0 + exp(-2.0 * u)) * X[i + P.cols];
    } else if (SWIGLU) {
        v = v / (1.0 + exp(-v)) * X[i + P.cols];
    }
    return select(0.0, v, e < P.cols);
}

fn x_vec(xo: u32, e: u32) -> vec4<f32> {
    return vec4<f32>(x_at(xo, e), x_at(xo, e + 1u), x_at(xo, e + 2u), x_at(xo, e + 3u));
}

fn w_vec(e: u32) -> vec4<f32> {
    return vec4<f32>(norm_w(e), norm_w(e + 1u), norm_w(e + 2u), norm_w(e + 3u));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    SUBGROUP_SIZE_PARAM
) {
    let row = (wid.x + wid.y * nwg.x) * RPW + lid / TPR;
    let lane = lid % TPR;
    let t0 = wid.z * TB;
    var acc: array<f32, TB>;
    var sq: array<f32, TB>;
    if (TILED) {
        for (var c0 = 0u; c0 < P.cols; c0 += CHUNK) {
            // Stage inputs c0.. of the TB tokens (zero past cols or tokens), summing their squares.
            workgroupBarrier();
            for (var t = 0u; t < TB; t++) {
                let live = t0 + t < P.tokens;
                let xo = P.x_off + (t0 + t) * P.x_stride;
                for (var i = lid; i < CHUNK / 4u; i += WG) {
                    let e = c0 + 4u * i;
                    var v = vec4<f32>(0.0);
                    if (live) {
                        v = x_vec(xo, e);
                    }
                    sq[t] += dot(v, v);
                    xs[t * (CHUNK / 4u) + i] = v * w_vec(e);
                }
            }
            workgroupBarrier();
            if (row < P.rows) {
                let rb = row * P.row_bytes;
                let u_end = min(P.units, (c0 + CHUNK) / 8u);
                for (var u = c0 / 8u + lane; u < u_end; u += TPR) {
                    let e0 = u * 8u;
                    let w = unit_w(rb, e0, P.cols);
                    let i4 = (e0 - c0) / 4u;
                    for (var t = 0u; t < TB; t++) {
                        acc[t] += dot(w[0], xs[t * (CHUNK / 4u) + i4]) + dot(w[1], xs[t * (CHUNK / 4u) + i4 + 1u]);
                    }
                }
            }
        }
        if (NORM) {
            // The squares were summed by the whole workgroup (each thread staged a share of the inputs).
            for (var t = 0u; t < TB; t++) {
                partial_sq[lid * TB + t] = sq[t];
            }
            workgroupBarrier();
            for (var s = WG / 2u; s > 0u; s >>= 1u) {
                if (lid < s) {
                    for (var t = 0u; t < TB; t++) {
                        partial_sq[lid * TB + t] += partial_sq[(lid + s) * TB + t];
                    }
                }
                workgroupBarrier();
            }
            for (var t = 0u; t < TB; t++) {
                sq[t] = partial_sq[t];
            }
        }
    } else if (row < P.rows) {
        // TB is 1 here (TILED covers TB > 1). Two units per pass: both units' weights and inputs are
        // read before either is used, so each thread has twice the loads in flight.
        let rb = row * P.row_bytes;
        let xo = P.x_off + t0 * P.x_stride;
        for (var u = lane; u < P.units; u += 2u * TPR) {
            let e0 = u * 8u;
            let second = u + TPR < P.units;
            let e1 = select(e0, e0 + 8u * TPR, second);
            let w = unit_w(rb, e0, P.cols);
            let v = unit_w(rb, e1, P.cols);
            let xa = x_vec(xo, e0);
            let xb = x_vec(xo, e0 + 4u);
            var xc = x_vec(xo, e1);
            var xd = x_vec(xo, e1 + 4u);
            if (!second) {
                xc = vec4<f32>(0.0);
                xd = vec4<f32>(0.0);
            }
            var nw0 = vec4<f32>(1.0);
            var nw1 = vec4<f32>(1.0);
            var nw2 = vec4<f32>(1.0);
            var nw3 = vec4<f32>(1.0);
            if (NORM) {
                nw0 = w_vec(e0);
                nw1 = w_vec(e0 + 4u);
                nw2 = w_vec(e1);
                nw3 = w_vec(e1 + 4u);
                sq[0] += dot(xa, xa) + dot(xb, xb) + dot(xc, xc) + dot(xd, xd);
            }
            acc[0] += dot(w[0], xa * nw0) + dot(w[1], xb * nw1) + dot(v[0], xc * nw2) + dot(v[1], xd * nw3);
        }
    }
    if (SUBGROUPS) {
        // Shuffles sum each subgroup's share of the row; the row's subgroups (one where they hold
        // TPR threads or more) are then added from workgroup memory.
        for (var t = 0u; t < TB; t++) {
            partial[lid * TB + t] = lanes_sum(acc[t], SUBGROUP_SIZE);
            if (NORM && !TILED) {
                partial_sq[lid * TB + t] = lanes_sum(sq[t], SUBGROUP_SIZE);
            }
        }
        workgroupBarrier();
        let step = min(TPR, SUBGROUP_SIZE);
        if (lane == 0u) {
            for (var t = 0u; t < TB; t++) {
                acc[t] = 0.0;
                if (!TILED) {
                    sq[t] = 0.0;
                }
                for (var k = 0u; k < TPR; k += step) {
                    acc[t] += partial[(lid + k) * TB + t];
                    if (NORM && !TILED) {
                        sq[t] += partial_sq[(lid + k) * TB + t];
                    }
                }
            }
        }
    } else if (TPR > 1u) {
        workgroupBarrier();
        for (var t = 0u; t < TB; t++) {
            partial[lid * TB + t] = acc[t];
            if (!TILED) {
                partial_sq[lid * TB + t] = sq[t];
            }
        }
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var t = 0u; t < TB; t++) {
                    partial[lid * TB + t] += partial[(lid + s) * TB + t];
                    if (NORM && !TILED) {
                        partial_sq[lid * TB + t] += partial_sq[(lid + s) * TB + t];
                    }
                }
            }
            workgroupBarrier();
        }
        for (var t = 0u; t < TB; t++) {
            acc[t] = partial[lid * TB + t];
            if (!TILED) {
                sq[t] = partial_sq[lid * TB + t];
            }
        }
    }
    if (NORM) {
        for (var t = 0u; t < TB; t++) {
            acc[t] *= inverseSqrt(sq[t] / f32(P.cols) + P.eps);
        }
    }
    if (ROPE) {
        if (lane == 0u) {
            for (var t = 0u; t < TB; t++) {
                rowv[(lid / TPR) * TB + t] = acc[t];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < P.rows) {
        for (var t = 0u; t < TB; t++) {
            if (t0 + t < P.tokens) {
                let yi = P.y_off + (t0 + t) * P.y_stride + row;
                var out = acc[t];
                if (ROPE) {
                    out = rope_epilogue(row, lid / TPR, t, t0 + t, out);
                } else if (P.accumulate != 0u) {
                    out += Y[yi];
                }
                Y[yi] = out;
            }
        }
    }
}
