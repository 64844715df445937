// One token of a gated delta net (qwen35moe's linear attention), one workgroup per value head h.
// X holds the convolved, SiLU'd [q | k | v] channels (hk key heads of q and k, hv value heads of v,
// each hd wide); value head h reads key head h mod hk. q and k are L2-normalised per head
// (x / sqrt(sum x^2 + eps)), q also scaled by 1 / sqrt(hd). From the projection row Proj: the output
// gate z (hv * hd at z_off), beta (hv at b_off) and alpha (hv at a_off); Vecs holds dt (hv), a (hv,
// -exp(A_log)) and the per-head norm weights (hd). Each value head keeps a state matrix S (hd x hd,
// row i an output dim, column j a key dim), updated by the gated delta rule:
//   S <- exp(a * softplus(alpha + dt)) * S;  S <- S + sigmoid(beta) * (v - S k) k^T;  o = S q
// and o is RMS-normalised (Vecs' weights) times silu(z) into Out. A thread owns rows of S, so the
// update needs no barrier. At position 0 (S[0] == 0: a new sequence) the state starts from zeros,
// whatever State held. MAX_HEAD and WG are prepended by the host.

struct Params {
    hk: u32,
    hv: u32,
    hd: u32,
    z_off: u32,
    b_off: u32,
    a_off: u32,
    eps: f32,
    pad0: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> Proj: array<f32>;
@group(0) @binding(2) var<storage, read> Vecs: array<f32>;
@group(0) @binding(3) var<storage, read_write> State: array<f32>;
@group(0) @binding(4) var<storage, read_write> Out: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;
@group(0) @binding(6) var<storage, read> S: array<u32>;

var<workgroup> qs: array<f32, MAX_HEAD>;
var<workgroup> ks: array<f32, MAX_HEAD>;
var<workgroup> os: array<f32, MAX_HEAD>;
var<workgroup> red: array<f32, WG>;

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let out = red[0];
    workgroupBarrier();
    return out;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let hd = P.hd;
    let kh = h % P.hk;
    let keys = P.hk * hd;
    var q2 = 0.0;
    var k2 = 0.0;
    for (var d = lid; d < hd; d += WG) {
        let q = X[kh * hd + d];
        let k = X[keys + kh * hd + d];
        qs[d] = q;
        ks[d] = k;
        q2 += q * q;
        k2 += k * k;
    }
    let rq = inverseSqrt(reduce_sum(q2, lid) + P.eps) * inverseSqrt(f32(hd));
    let rk = inverseSqrt(reduce_sum(k2, lid) + P.eps);
    for (var d = lid; d < hd; d += WG) {
        qs[d] *= rq;
        ks[d] *= rk;
    }
    workgroupBarrier();
    let beta = 1.0 / (1.0 + exp(-Proj[P.b_off + h]));
    let x = Proj[P.a_off + h] + Vecs[h];
    // softplus(x) = log(1 + e^x), without overflow for large x.
    let softplus = max(x, 0.0) + log(1.0 + exp(-abs(x)));
    let decay = exp(softplus * Vecs[P.hv + h]);
    let fresh = S[0] == 0u;
    var o2 = 0.0;
    for (var i = lid; i < hd; i += WG) {
        let base = (h * hd + i) * hd;
        var recalled = 0.0;
        for (var j = 0u; j < hd; j++) {
            let s = select(State[base + j], 0.0, fresh) * decay;
            State[base + j] = s;
            recalled += s * ks[j];
        }
        let delta = (X[2u * keys + h * hd + i] - recalled) * beta;
        var o = 0.0;
        for (var j = 0u; j < hd; j++) {
            let s = State[base + j] + delta * ks[j];
            State[base + j] = s;
            o += s * qs[j];
        }
        os[i] = o;
        o2 += o * o;
    }
    let r = inverseSqrt(reduce_sum(o2, lid) / f32(hd) + P.eps);
    for (var i = lid; i < hd; i += WG) {
        let z = Proj[P.z_off + h * hd + i];
        Out[h * hd + i] = os[i] * r * Vecs[2u * P.hv + i] * (z / (1.0 + exp(-z)));
    }
}
