import threading

threading.Event().wait()
