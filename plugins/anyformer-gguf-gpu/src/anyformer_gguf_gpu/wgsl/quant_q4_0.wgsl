// Q4_0: 32 elements in 18 bytes: f16 d, then 16 bytes of nibbles. Element j < 16 is the low nibble
// of byte j, element j >= 16 the high nibble of byte j - 16; value = d * (q - 8).
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    let base = rb + (e0 >> 5u) * 18u;
    let d = half_at(base);
    let j0 = e0 & 31u;
    let shift = (j0 >> 4u) * 4u;
    let qs = base + 2u + (j0 & 15u);
    let lo = vec4<f32>(fields(u32_at(qs), shift, 15u)) - 8.0;
    let hi = vec4<f32>(fields(u32_at(qs + 4u), shift, 15u)) - 8.0;
    return array<vec4<f32>, 2>(d * lo, d * hi);
}
