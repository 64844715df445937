// Q6_K: 256 elements in 210 bytes: 128 bytes ql, 64 bytes qh, 16 signed scales, f16 d.
// Element e: half n = e/128, quarter k = (e%128)/32, l = e%32; low 4 bits from nibble k/2 of
// ql[64n + l + 32(k&1)], high 2 bits from bits 2k of qh[32n + l]; value = d * scale[8n + l/16 + 2k] * (q - 32).
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    let base = rb + (e0 >> 8u) * 210u;
    let e = e0 & 255u;
    let n = e >> 7u;
    let k = (e & 127u) >> 5u;
    let l0 = e & 31u;
    let scale = half_at(base + 208u) * i8_at(base + 192u + 8u * n + (l0 >> 4u) + 2u * k);
    let ql = base + 64u * n + l0 + 32u * (k & 1u);
    let lshift = (k >> 1u) * 4u;
    let qh = base + 128u + 32u * n + l0;
    let hshift = 2u * k;
    let lo = fields(u32_at(ql), lshift, 15u) | (fields(u32_at(qh), hshift, 3u) << vec4<u32>(4u));
    let hi = fields(u32_at(ql + 4u), lshift, 15u) | (fields(u32_at(qh + 4u), hshift, 3u) << vec4<u32>(4u));
    return array<vec4<f32>, 2>(scale * (vec4<f32>(lo) - 32.0), scale * (vec4<f32>(hi) - 32.0));
}
