// Mixture-of-experts combine: h[t, i] += sum_j w[t, j] * src[row[t, j], i], for the M (row, weight) entries of
// token t in the table (row a u32, weight an f32's bits), in table order: a step's expert outputs, each computed
// for the tokens routed to it and packed by expert, weighted and added back into every token's residual.

struct Params {
    n: u32,
    m: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> Src: array<f32>;
@group(0) @binding(1) var<storage, read> Table: array<u32>;
@group(0) @binding(2) var<storage, read_write> H: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= P.n) {
        return;
    }
    var acc = 0.0;
    for (var j = 0u; j < P.m; j++) {
        let at = 2u * (t * P.m + j);
        acc += bitcast<f32>(Table[at + 1u]) * Src[Table[at] * P.n + i];
    }
    H[t * P.n + i] += acc;
}
