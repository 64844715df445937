// y[t, row] (+)= sum_e W[row, e] * x[t, e], reading W's raw blocks (unit_w, from the quant_*.wgsl
// prepended, decodes 8 weights at a time).
// TPR threads share one row (striding over its 8-element units, then a reduction in workgroup
// memory; TPR = 1 needs no barrier, which suits CPU adapters), so a workgroup covers WG / TPR rows.
// Each thread applies every decoded unit to TB tokens: the weights are read once per TB tokens
// (TB = 1 for decoding, more for prefill, where this is the tiled matrix-matrix product).
// Workgroups past 65535 spill into wid.y; wid.z picks the group of TB tokens. SWIGLU (a constant)
// makes the input silu(gate) * up of a [gate | up] row (see x_at).

const RPW: u32 = WG / TPR;

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
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> partial: array<f32, WG * TB>;

fn x_at(i: u32, n: u32) -> f32 {
    // One input, zero at or past n (float rows need not be a multiple of 8 long). With SWIGLU the
    // input row is [gate | up] and the value is silu(gate) * up: the down projection reads the
    // feed-forward's activation without a separate SwiGLU dispatch.
    let j = min(i, n - 1u);
    var v = X[j];
    if (SWIGLU) {
        v = v / (1.0 + exp(-v)) * X[j + P.cols];
    }
    return select(0.0, v, i < n);
}

fn x_vec(i: u32, n: u32) -> vec4<f32> {
    return vec4<f32>(x_at(i, n), x_at(i + 1u, n), x_at(i + 2u, n), x_at(i + 3u, n));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = (wid.x + wid.y * nwg.x) * RPW + lid / TPR;
    let lane = lid % TPR;
    let t0 = wid.z * TB;
    var acc: array<f32, TB>;
    if (row < P.rows) {
        let rb = row * P.row_bytes;
        for (var u = lane; u < P.units; u += TPR) {
            let e0 = u * 8u;
            let w = unit_w(rb, e0, P.cols);
            for (var t = 0u; t < TB; t++) {
                if (t0 + t < P.tokens) {
                    let xo = P.x_off + (t0 + t) * P.x_stride;
                    let end = xo + P.cols;
                    acc[t] += dot(w[0], x_vec(xo + e0, end)) + dot(w[1], x_vec(xo + e0 + 4u, end));
                }
            }
        }
    }
    if (TPR > 1u) {
        for (var t = 0u; t < TB; t++) {
            partial[lid * TB + t] = acc[t];
        }
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var t = 0u; t < TB; t++) {
                    partial[lid * TB + t] += partial[(lid + s) * TB + t];
                }
            }
            workgroupBarrier();
        }
        for (var t = 0u; t < TB; t++) {
            acc[t] = partial[lid * TB + t];
        }
    }
    if (lane == 0u && row < P.rows) {
        for (var t = 0u; t < TB; t++) {
            if (t0 + t < P.tokens) {
                let yi = P.y_off + (t0 + t) * P.y_stride + row;
                var out = acc[t];
                if (P.accumulate != 0u) {
                    out += Y[yi];
                }
                Y[yi] = out;
            }
        }
    }
}
