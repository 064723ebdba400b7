//! Cholesky and NNLS on small systems solved by hand.

use super::*;

#[test]
fn cholesky_solves_a_small_system() {
    let mut a = vec![vec![4.0, 2.0], vec![2.0, 3.0]];
    let z = cholesky_solve(&mut a, &[10.0, 8.0]).unwrap();
    // 4x + 2y = 10, 2x + 3y = 8 → x = 1.75, y = 1.5.
    assert!((z[0] - 1.75).abs() < 1e-12 && (z[1] - 1.5).abs() < 1e-12);
    let mut singular = vec![vec![1.0, 1.0], vec![1.0, 1.0]];
    assert!(cholesky_solve(&mut singular, &[1.0, 1.0]).is_none());
}

#[test]
fn nnls_clamps_a_coefficient_that_least_squares_makes_negative() {
    // Least squares of y = [1, 2] on columns [1, 1] and [1, 0]:
    // unconstrained x = (2, −1); with x ≥ 0 the best is (1.5, 0).
    let g = vec![vec![2.0, 1.0], vec![1.0, 1.0]];
    let h = vec![3.0, 1.0];
    let x = nnls_gram(&g, &h, &[true, true]);
    // (The ridge moves it by 1e-9 relative.)
    assert!((x[0] - 1.5).abs() < 1e-6 && x[1] == 0.0, "{x:?}");
}
