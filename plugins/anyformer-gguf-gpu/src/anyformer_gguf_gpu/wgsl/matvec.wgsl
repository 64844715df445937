// y[b, row] (+)= sum_e W[row, e] * x[b, e]: one workgroup per (row, token b), the row's raw blocks
// decoded by unit_vals (from the quant_*.wgsl prepended) 8 elements at a time, threads striding
// over the row, then a tree reduction in workgroup memory. Rows past 65535 spill into wid.y.

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
    w_base: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    let xo = P.x_off + wid.z * P.x_stride;
    var acc = 0.0;
    if (row < P.rows) {
        let rb = P.w_base + row * P.row_bytes;
        for (var u = lid; u < P.units; u += WG) {
            let e0 = u * 8u;
            let v = unit_vals(rb, e0, P.cols);
            for (var i = 0u; i < 8u; i++) {
                if (e0 + i < P.cols) {
                    acc += v[i] * X[xo + e0 + i];
                }
            }
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u && row < P.rows) {
        let yi = P.y_off + wid.z * P.y_stride + row;
        var out = partial[0];
        if (P.accumulate != 0u) {
            out += Y[yi];
        }
        Y[yi] = out;
    }
}
