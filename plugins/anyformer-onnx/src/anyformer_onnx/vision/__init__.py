"""Image graphs and their handles: classification, detection, segmentation, depth."""
