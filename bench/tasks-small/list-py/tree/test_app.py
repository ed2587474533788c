import app
