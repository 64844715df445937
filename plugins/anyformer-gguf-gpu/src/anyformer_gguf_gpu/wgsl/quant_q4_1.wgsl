// Q4_1: 32 elements in 20 bytes: f16 d, f16 m, 16 bytes of nibbles (laid out as Q4_0); value = d * q + m.
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    let base = rb + (e0 >> 5u) * 20u;
    let dm = unpack2x16float(u32_at(base));
    let j0 = e0 & 31u;
    let shift = (j0 >> 4u) * 4u;
    let qs = base + 4u + (j0 & 15u);
    let lo = vec4<f32>(fields(u32_at(qs), shift, 15u));
    let hi = vec4<f32>(fields(u32_at(qs + 4u), shift, 15u));
    return array<vec4<f32>, 2>(dm.x * lo + dm.y, dm.x * hi + dm.y);
}
