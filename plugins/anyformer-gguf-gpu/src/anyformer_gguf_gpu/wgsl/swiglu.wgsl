// SwiGLU: y[b, i] = silu(g[b, i]) * u[b, i], the gate and up halves of one buffer per token.

struct Params {
    n: u32,
    tokens: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> GU: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let b = gid.y;
    if (i >= P.n) {
        return;
    }
    let g = GU[b * 2u * P.n + i];
    let u = GU[b * 2u * P.n + P.n + i];
    Y[b * P.n + i] = g / (1.0 + exp(-g)) * u;
}
