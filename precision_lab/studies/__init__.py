"""Studies: the experiments behind the figures and figures/REPORT.md.

Holds :mod:`.policy` (the precision-policy and INT8 studies: training runs per policy, PTQ and
QAT, and the Markdown tables they give), :mod:`.emulated` (the emulated-arithmetic studies:
summation, Kahan, iterative refinement, probabilistic bounds), :mod:`.sr_variants` (few-bit
stochastic rounding: the biases of SRFF/SRF/SRC and the summation error as the random bits
vary), :mod:`.fp4` (the FP4-era papers' numbers), :mod:`.gradient_noise` (the gradient-to-noise
ratio of "FP4 all the way" and the switch of its backward to FP32) and :mod:`.text` (number
formatting shared by the report's prose).

May import every layer up to :mod:`precision_lab.training`; not :mod:`precision_lab.verify`
(a sibling). The figure jobs in :mod:`precision_lab.figures` call these.

Where a new thing goes: a new study (an experiment whose numbers reach the report) is a module
here returning plain data and Markdown; its figure is a ``fig_*.py`` job in
:mod:`precision_lab.figures`.

>>> from precision_lab.studies.text import signed
>>> signed(0.5)
'+0.50'
"""
