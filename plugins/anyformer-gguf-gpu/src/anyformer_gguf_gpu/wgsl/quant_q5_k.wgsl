// Q5_K: 256 elements in 176 bytes: f16 d, f16 dmin, 12 bytes of scales/mins, 32 bytes qh, 128 bytes qs.
// As Q4_K, plus bit s of qh[l] as the fifth bit (16) of element l of sub-block s.
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    let base = rb + (e0 >> 8u) * 176u;
    let s = (e0 & 255u) >> 5u;
    let sm = k_scale_min(base + 4u, s);
    let dd = unpack2x16float(u32_at(base));
    let dl = dd.x * sm.x;
    let ml = dd.y * sm.y;
    let shift = (s & 1u) * 4u;
    let l0 = e0 & 31u;
    let qs = base + 48u + (s >> 1u) * 32u + l0;
    let qh = base + 16u + l0;
    let lo = fields(u32_at(qs), shift, 15u) | (fields(u32_at(qh), s, 1u) << vec4<u32>(4u));
    let hi = fields(u32_at(qs + 4u), shift, 15u) | (fields(u32_at(qh + 4u), s, 1u) << vec4<u32>(4u));
    return array<vec4<f32>, 2>(dl * vec4<f32>(lo) - ml, dl * vec4<f32>(hi) - ml);
}
