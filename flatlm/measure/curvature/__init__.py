"""Curvature of the loss: the Fisher and Hessian traces (Hutchinson, per-example ghost norms),
their shared inputs (``common``), Hessian-vector products, Lanczos spectra, per-block traces, the
grown-model traces and the measurements beyond the trace."""
