"""What the commands show: report builders and their rendering, above the model.

:mod:`benchcal.reports.predictions` builds the fit report, quantization matrix, hardware leaderboard,
recommendations and catalogue listings from the predictor; :mod:`benchcal.reports.calibration` the
measured-vs-predicted report from the calibration's comparison; :mod:`benchcal.reports.render` formats any of
them as a terminal table, Markdown, JSON or one HTML page.
"""
