r"""Lanczos tridiagonalisation of a symmetric operator, and what it gives: Ritz pairs and Gauss
quadrature nodes and weights.

m steps from a start vector v build an orthonormal basis Q (m, P) of the Krylov space
span{v, Av, ..., A^{m-1} v} with Q A Q^T = T tridiagonal. Then

- the largest Ritz value max eig(T) converges to lambda_max(A) from below (Kaniel-Paige), and
  its Ritz vector u = Q^T y is the top eigenvector's estimate;
- with T = Y diag(theta) Y^T, the nodes theta_j and weights tau_j = Y_{0j}^2 are the m-point
  Gauss quadrature of the spectral measure of A seen from v: sum_j tau_j f(theta_j) =
  v^T f(A) v / v^T v exactly for every polynomial f of degree <= 2m - 1 (Golub and Meurant,
  *Matrices, Moments and Quadrature*, 2010). Averaged over random v, this is stochastic Lanczos
  quadrature (Ubaru, Chen and Saad, SIAM J. Matrix Anal. Appl. 2017; Ghorbani, Krishnan and Xiao,
  ICML 2019, for neural-network Hessians).

Each new vector is orthogonalised against every previous one, twice (full reorthogonalisation):
without it, rounding makes copies of converged eigenvalues ("ghosts") that would distort the
quadrature weights. Memory: m vectors of P numbers in the operator's dtype. The coefficients are
float64. A Krylov space that closes early (beta ~ 0: v lies in an invariant subspace) stops the
iteration; T is then exact.

>>> A = torch.diag(torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
>>> t = lanczos(lambda v: A @ v, torch.ones(3, dtype=torch.float64), 3)
>>> [round(x, 10) for x in ritz_values(t)]
[1.0, 2.0, 5.0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

BREAKDOWN = 1e-10  # relative size of beta at which the Krylov space counts as closed


@dataclass
class Tridiagonal:
    """The Lanczos result: T's diagonal ``alpha`` (m,), off-diagonal ``beta`` (m-1,), float64,
    and the basis ``Q`` (m, P) in the start vector's dtype."""

    alpha: torch.Tensor
    beta: torch.Tensor
    Q: torch.Tensor

    def matrix(self) -> torch.Tensor:
        return (torch.diag(self.alpha) + torch.diag(self.beta, 1) + torch.diag(self.beta, -1))


def lanczos(matvec: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor,
            steps: int) -> Tridiagonal:
    """``steps`` Lanczos steps of the symmetric operator ``matvec`` from ``start`` (flat)."""
    if steps < 1:
        raise ValueError(f"steps={steps}: use >= 1")
    q = start / start.norm()
    basis, alphas, betas = [q], [], []
    scale = 0.0
    for j in range(min(steps, start.numel())):
        w = matvec(q)
        alpha = float(w.double() @ q.double())
        alphas.append(alpha)
        Q = torch.stack(basis)  # (j+1, P)
        for _ in range(2):  # full reorthogonalisation (also removes alpha q and beta q_prev)
            w = w - Q.T @ (Q @ w)
        beta = float(w.double().norm())
        scale = max(scale, abs(alpha), beta)
        if j == steps - 1 or len(basis) == start.numel() or beta <= BREAKDOWN * scale:
            break
        betas.append(beta)
        q = w / beta
        basis.append(q)
    return Tridiagonal(torch.tensor(alphas, dtype=torch.float64),
                       torch.tensor(betas, dtype=torch.float64), torch.stack(basis[:len(alphas)]))


def ritz_values(t: Tridiagonal) -> list[float]:
    return torch.linalg.eigvalsh(t.matrix()).tolist()


def top_ritz_pair(t: Tridiagonal) -> tuple[float, torch.Tensor]:
    """(largest Ritz value, its unit Ritz vector in the operator's space)."""
    theta, Y = torch.linalg.eigh(t.matrix())
    u = Y[:, -1].to(t.Q.device, t.Q.dtype) @ t.Q
    return float(theta[-1]), u / u.norm()


def quadrature(t: Tridiagonal) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss nodes theta (m,) and weights tau (m,), sum tau = 1, both float64."""
    theta, Y = torch.linalg.eigh(t.matrix())
    return theta, Y[0].square()
