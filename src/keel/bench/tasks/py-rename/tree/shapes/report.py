from shapes.geometry import area_of, perimeter


def describe(name, points):
    # area_of_unit is not the function: it is a unit label and must stay as it is.
    area_of_unit = "m²"
    return f"{name}: area {area_of(points):.1f} {area_of_unit}, perimeter {perimeter(points):.1f} m"
