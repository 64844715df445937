// Embedding lookup: y[b, :] = the dequantised row Ids[pos + b] of W (quant_*.wgsl prepended) times
// scale (1, or Gemma's sqrt(n_embd)).
// The ids live on the GPU (the sampler writes the next one there), so decoding reads none back.

struct Params {
    cols: u32,
    row_bytes: u32,
    units: u32,
    rows: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> Ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;
@group(0) @binding(4) var<storage, read> S: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = wid.x;
    // An id out of range (a corrupt prompt) reads row 0 rather than past the buffer.
    let id = select(0u, Ids[S[0] + b], Ids[S[0] + b] < P.rows);
    let rb = id * P.row_bytes;
    for (var u = lid; u < P.units; u += WG) {
        let e0 = u * 8u;
        let w = unit_w(rb, e0, P.cols);
        for (var i = 0u; i < 8u; i++) {
            if (e0 + i < P.cols) {
                Y[b * P.cols + e0 + i] = w[i / 4u][i % 4u] * P.scale;
            }
        }
    }
}
