// F16: 2 bytes an element.
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    var v: array<f32, 8>;
    if (e0 + 8u <= cols) {
        let b = rb + 2u * e0;
        for (var i = 0u; i < 4u; i++) {
            let pair = unpack2x16float(u32_at(b + 4u * i));
            v[2u * i] = pair.x;
            v[2u * i + 1u] = pair.y;
        }
    } else {
        for (var i = 0u; i < 8u; i++) {
            let e = min(e0 + i, cols - 1u);
            v[i] = select(0.0, half_at(rb + 2u * e), e0 + i < cols);
        }
    }
    return array<vec4<f32>, 2>(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
