"""morlfed analysis: multi-objective metrics, plots and result tables.

* :mod:`analysis.metrics` -- hypervolume, IGD / IGD+, sparsity, cardinality, regret, expected
  utility, the campaign front (numpy and pymoo only).
* :mod:`analysis.runs` -- finding and loading run directories (incomplete or malformed ones are
  reported, never used).
* :mod:`analysis.evaluate` -- ``python -m analysis.evaluate``: ``summary.csv`` and ``comparison.md``.
* :mod:`analysis.plots` -- figures (fronts, similarity heatmaps, cluster evolution, learning curves).
* :mod:`analysis.plot` -- ``python -m analysis.plot``: every figure of a campaign as PNG and PDF.
* :mod:`analysis.results` -- ``python -m analysis.results DOC``: the generated tables of
  ``docs/results.md`` rebuilt from committed ``summary.csv`` files.
* ``analysis/notebooks/`` -- ``pareto_fronts.ipynb`` and ``metrics.ipynb``.

See ``docs/analysis.md``.
"""
