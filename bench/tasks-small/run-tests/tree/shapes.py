def square_area(side):
    return side * side


def rectangle_area(width, height):
    return width * height
