set -e
if grep -rnw --include='*.py' --include='*.md' area_of .; then
  echo "area_of is still used (above)"; exit 1
fi
grep -q 'area_of_unit = "m²"' shapes/report.py || { echo "area_of_unit was renamed too"; exit 1; }
grep -q '^def polygon_area(points):' shapes/geometry.py
grep -q '`polygon_area(points)`' README.md
python3 -m unittest -q
python3 -c 'from shapes import polygon_area; assert polygon_area([(0,0),(3,0),(0,4)]) == 6.0'
