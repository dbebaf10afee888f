# nbgrader's student side in the JupyterLab of `make lab` and Binder: the Validate button runs the whole notebook
# in a fresh kernel. Run it as the grader runs it: training cells with their short budget (TDD_QUICK), waiting
# for the kernel in slices, and long enough per cell for a slow machine (nbgrader's own defaults stop a cell
# after 30 s, and a run whose output arrives later than 4 s, with an error).
c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

c.Execute.kernel_manager_class = "autograder.lab_validate.ValidateKernelManager"
c.Execute.timeout = 300
c.Execute.iopub_timeout = 30
