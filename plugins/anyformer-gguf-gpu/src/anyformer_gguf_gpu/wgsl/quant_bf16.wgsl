// BF16: the high 16 bits of an f32.
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let e = e0 + i;
        let b = rb + 2u * e;
        let bits = ((W[b >> 2u] >> ((b & 2u) << 3u)) & 0xffffu) << 16u;
        v[i] = select(0.0, bitcast<f32>(bits), e < cols);
    }
    return v;
}
