// Q4_K: 256 elements in 144 bytes: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles.
// Sub-block s (32 elements) is the low (s even) or high (s odd) nibbles of bytes 32*(s/2)..+31;
// value = d * scale_s * q - dmin * min_s.
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    let base = rb + (e0 >> 8u) * 144u;
    let s = (e0 & 255u) >> 5u;
    let sm = k_scale_min(base + 4u, s);
    let dd = unpack2x16float(u32_at(base));
    let dl = dd.x * sm.x;
    let ml = dd.y * sm.y;
    let shift = (s & 1u) * 4u;
    let qs = base + 16u + (s >> 1u) * 32u + (e0 & 31u);
    let lo = vec4<f32>(fields(u32_at(qs), shift, 15u));
    let hi = vec4<f32>(fields(u32_at(qs + 4u), shift, 15u));
    return array<vec4<f32>, 2>(dl * lo - ml, dl * hi - ml);
}
