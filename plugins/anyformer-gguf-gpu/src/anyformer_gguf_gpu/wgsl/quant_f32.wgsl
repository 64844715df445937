// F32: 4 bytes an element. unit_w gives the 8 weights of row elements e0..e0+7 (0 past cols).
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let e = min(e0 + i, cols - 1u);
        v[i] = select(0.0, bitcast<f32>(W[(rb >> 2u) + e]), e0 + i < cols);
    }
    return array<vec4<f32>, 2>(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
