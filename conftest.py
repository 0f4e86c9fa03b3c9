# lets `pytest` import the top-level scripts (model.py, train.py, ...) from tests/
