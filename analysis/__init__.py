"""morlfed analysis: campaign evaluation, figures and result tables.

The metrics themselves are :mod:`morlfed.metrics`, the figure of one run :mod:`morlfed.metrics.figures`.

Libraries (what notebooks and other code import):

* :mod:`morlfed.analysis.runs` -- finding and loading run directories (incomplete or malformed ones are
  reported, never used).
* :mod:`morlfed.analysis.run_files` -- reading and checking the files of one run directory
  (:class:`morlfed.analysis.run_files.RunDirError` names the problem).
* :mod:`morlfed.analysis.partial` -- unfinished runs (no ``metrics.json``): what they logged so far.
* :mod:`morlfed.analysis.variants` -- variant labels (the settings that tell runs apart) and repeated runs.
* :mod:`morlfed.analysis.campaign` -- selecting and evaluating runs: reference fronts, every metric
  recomputed (:class:`morlfed.analysis.campaign.Campaign`), vision accuracies.
* :mod:`morlfed.analysis.tables` -- comparison tables (mean ± std over seeds, marked by paired tests) and
  the budget table.
* :mod:`morlfed.analysis.comparison` -- ``comparison.md`` and ``stats.csv`` of an evaluated campaign.
* :mod:`morlfed.analysis.charts` -- campaign figures (fronts of several algorithms, similarity heatmaps,
  cluster evolution, learning curves, metric bars).
* :mod:`morlfed.analysis.campaign_figures` -- every figure of a campaign written to a folder.
* :mod:`morlfed.analysis.published` -- the generated blocks of the results pages, parsed and rebuilt.

Command lines (argument parsing, printing and exit status only):

* :mod:`morlfed.analysis.evaluate` -- ``python -m morlfed.analysis.evaluate``: ``summary.csv`` and ``comparison.md``.
* :mod:`morlfed.analysis.rebuild` -- ``python -m morlfed.analysis.rebuild DIR``: ``stats.csv`` and
  ``comparison.md`` of an evaluated folder rewritten from its ``summary.csv`` alone.
* :mod:`morlfed.analysis.plot` -- ``python -m morlfed.analysis.plot``: every figure of a campaign as PNG and PDF.
* :mod:`morlfed.analysis.results` -- ``python -m morlfed.analysis.results DOC``: the generated tables of
  ``docs/results.md`` and ``docs/results/*.md`` rebuilt from committed ``summary.csv`` files.
* :mod:`morlfed.analysis.arguments` -- the pieces they share.

``analysis/notebooks/``: ``pareto_fronts.ipynb`` and ``metrics.ipynb``. See ``docs/analysis.md``.
"""

if __name__ != "morlfed.analysis":
    # the folder also sits at the repository root, where `import analysis` would load a second copy
    # of every module (a second class for each class: isinstance fails across the two)
    raise ImportError(f"{__name__!r} is the package morlfed.analysis: import it as morlfed.analysis")

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 8
