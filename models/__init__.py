"""The model suite, run inside each stack's venv.

``suite.toml`` lists every model by name with its factory (``module:function``);
the parent reads that file, never this package. A factory returns a
:class:`models.case.ModelCase`: a freshly built module and example inputs. The
worker saves that module's weights and the inputs once and loads them into every
stack, so both stacks see the same numbers whatever their random generators do.
"""
