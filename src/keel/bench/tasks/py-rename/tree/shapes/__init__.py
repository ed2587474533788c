from shapes.geometry import area_of, perimeter

__all__ = ["area_of", "perimeter"]
