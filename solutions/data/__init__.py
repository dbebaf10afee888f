"""The embedded data sets: generated or shipped with the package, no download by default."""
