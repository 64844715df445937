// LFM2's gated short convolution for the tokens of one step, one thread per channel c:
//   B, C, x = the three n-wide thirds of the in_proj output row of token t (BCX)
//   u[t] = B[t] * x[t]
//   y[t] = C[t] * sum_j Taps[c, j] * u[t - (taps - 1) + j]     (causal, depthwise; the last tap is token t)
// The taps - 1 inputs before the step's first token come from State (rows oldest first), which the
// thread rewrites with the last taps - 1 inputs when it is done: the state stays on the GPU between
// steps. A step at position 0 starts from zeros (a new sequence), whatever State held.
// Without GATED (a constant; qwen35moe's delta nets) the input is x alone, the row's first n values,
// and y = silu(conv(x)).
// MAX_TAPS (the window's size), GATED and WG are prepended by the host. Each thread walks its channel's
// tokens in order, so reading and rewriting State never race.

struct Params {
    n: u32,
    taps: u32,
    tokens: u32,
    bcx_stride: u32,
    y_stride: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> BCX: array<f32>;
@group(0) @binding(1) var<storage, read> Taps: array<f32>;
@group(0) @binding(2) var<storage, read_write> State: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;
@group(0) @binding(5) var<storage, read> S: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = gid.x + gid.y * nwg.x * WG;
    if (c >= P.n) {
        return;
    }
    let keep = P.taps - 1u;
    let fresh = S[0] == 0u;
    // win[0..keep) holds the inputs before the current token (oldest first), win[keep] the current one.
    var win: array<f32, MAX_TAPS>;
    for (var j = 0u; j < keep; j++) {
        win[j] = select(State[j * P.n + c], 0.0, fresh);
    }
    for (var t = 0u; t < P.tokens; t++) {
        let row = t * P.bcx_stride;
        if (GATED) {
            win[keep] = BCX[row + c] * BCX[row + 2u * P.n + c];
        } else {
            win[keep] = BCX[row + c];
        }
        var acc = 0.0;
        for (var j = 0u; j <= keep; j++) {
            acc += Taps[c * P.taps + j] * win[j];
        }
        if (GATED) {
            Y[t * P.y_stride + c] = BCX[row + P.n + c] * acc;
        } else {
            Y[t * P.y_stride + c] = acc / (1.0 + exp(-acc));
        }
        for (var j = 0u; j < keep; j++) {
            win[j] = win[j + 1u];
        }
    }
    for (var j = 0u; j < keep; j++) {
        State[j * P.n + c] = win[j];
    }
}
