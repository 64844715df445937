// RMSNorm: y[b, i] = x[b, i] / sqrt(mean(x[b]^2) + eps) * w[i], one workgroup per token.
// With accumulate, y[b, i] = (y[b, i] + that) * scale: a normalised branch added to the residual and
// the layer's output scaled (Gemma's post-attention and post-FFN norms, Gemma 4's layer scale).

struct Params {
    n: u32,
    x_stride: u32,
    y_stride: u32,
    eps: f32,
    x_off: u32,
    accumulate: u32,
    scale: f32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> Wn: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let xo = P.x_off + wid.x * P.x_stride;
    let yo = wid.x * P.y_stride;
    var acc = 0.0;
    for (var i = lid; i < P.n; i += WG) {
        let v = X[xo + i];
        acc += v * v;
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let r = inverseSqrt(partial[0] / f32(P.n) + P.eps);
    for (var i = lid; i < P.n; i += WG) {
        var v = X[xo + i] * r * Wn[i];
        if (P.accumulate != 0u) {
            v = (Y[yo + i] + v) * P.scale;
        }
        Y[yo + i] = v;
    }
}
